package proxy

import "context"

// SetAfterUpstreamFunc sets the hook that runs after the upstream answered a
// call, before pgonce records it.
func SetAfterUpstreamFunc[TTx any](p *Proxy[TTx], f func(ctx context.Context, tool string)) {
	p.afterUpstreamFunc = f
}
