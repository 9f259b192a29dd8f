package toolcall

import (
	"context"

	"github.com/pgonce/pgonce/outbox"
)

type requestKey struct{}

// ContextWithRequest returns a copy of ctx that carries req, the pgonce
// request an attempt runs a tool for. The adapters that run an SDK's own tool
// code as a provider (an Anthropic tool runner's tool, an MCP server's tool
// handler) call the tool under it, so that the tool can send the key
// downstream as its idempotency key: see [RequestFromContext].
func ContextWithRequest(ctx context.Context, req outbox.Request) context.Context {
	return context.WithValue(ctx, requestKey{}, req)
}

// RequestFromContext returns the pgonce request ctx carries, and whether it
// carries one: inside a tool an adapter runs as a provider, the action's key
// ([outbox.Request.Key], to pass downstream, say as an Idempotency-Key
// header), its canonical arguments and its attempt number.
func RequestFromContext(ctx context.Context) (outbox.Request, bool) {
	req, ok := ctx.Value(requestKey{}).(outbox.Request)
	return req, ok
}
