package httpprovider

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/pgonce/pgonce/internal/header"
	"github.com/pgonce/pgonce/outbox"
)

// LookupConfig configures the read of a [LookupProvider]: how to ask the
// downstream API whether an action happened.
type LookupConfig struct {
	// URLFunc returns the URL that reads the action of one call, typically
	// by its natural id ([outbox.Request.NaturalID]). Required.
	URLFunc func(req outbox.Request) (string, error)
	// Method is the lookup's method. Defaults to GET.
	Method string
	// RequestFunc, when set, is called with every lookup request before it
	// is sent, as [Config.RequestFunc] is.
	RequestFunc func(r *http.Request, req outbox.Request) error
}

// LookupProvider is a [Provider] that is also an [outbox.Lookuper]: after
// an attempt whose outcome is unknown, and past the API's key retention,
// the action is read before it is written again.
//
// A 2xx answer to the lookup is the action found: its envelope (see
// [Response]) is stored as the key's response. A 404 is the action not
// found. Any other answer or error leaves the outcome unknown, and the
// lookup is tried again later.
type LookupProvider struct {
	*Provider
	lookup LookupConfig
}

// NewLookup returns a provider for config that looks actions up by lookup.
// Its errors are [New]'s, and one matching [ErrInvalidConfig] when
// lookup.URLFunc is nil or lookup.Method is not a method name.
func NewLookup(config Config, lookup LookupConfig) (*LookupProvider, error) {
	p, err := New(config)
	if err != nil {
		return nil, err
	}
	lookup.Method = cmp.Or(lookup.Method, http.MethodGet)
	switch {
	case lookup.URLFunc == nil:
		return nil, fmt.Errorf("%w: LookupConfig.URLFunc is required", ErrInvalidConfig)
	case !header.ValidToken(lookup.Method):
		return nil, fmt.Errorf("%w: LookupConfig.Method %q must be a method name", ErrInvalidConfig, lookup.Method)
	}
	return &LookupProvider{Provider: p, lookup: lookup}, nil
}

// Register registers p in r as tool, delivered
// [outbox.LookupByNaturalID], with [Config.KeyRetention] as the tool's
// [outbox.ToolOpts.KeyRetention]. Register it by key with
// [outbox.Registry.RegisterWithOpts] to retry by key within the API's key
// retention and look up only past it.
func (p *LookupProvider) Register(r *outbox.Registry, tool string) error {
	return r.RegisterWithOpts(tool, p, outbox.LookupByNaturalID, &outbox.ToolOpts{KeyRetention: p.config.KeyRetention})
}

// Lookup asks the downstream API whether req's action happened.
func (p *LookupProvider) Lookup(ctx context.Context, req outbox.Request) (json.RawMessage, bool, error) {
	target, err := p.lookup.URLFunc(req)
	if err != nil {
		return nil, false, fmt.Errorf("lookup url: %w", err)
	}
	if !validURL(target) {
		return nil, false, fmt.Errorf("lookup url: %q is not an absolute http or https URL", target)
	}
	ctx, cancel := context.WithTimeout(ctx, p.config.Timeout)
	defer cancel()
	httpReq, err := http.NewRequestWithContext(ctx, p.lookup.Method, target, http.NoBody)
	if err != nil {
		return nil, false, fmt.Errorf("lookup request: %w", err)
	}
	if p.lookup.RequestFunc != nil {
		if err := p.lookup.RequestFunc(httpReq, req); err != nil {
			return nil, false, fmt.Errorf("lookup request: %w", err)
		}
	}
	resp, _, err := p.send(httpReq)
	if err != nil {
		return nil, false, fmt.Errorf("lookup: %w", err)
	}
	switch {
	case resp.Status >= 200 && resp.Status <= 299:
		stored, err := resp.Encode()
		if err != nil {
			return nil, false, err
		}
		return stored, true, nil
	case resp.Status == http.StatusNotFound:
		return nil, false, nil
	}
	return nil, false, fmt.Errorf("lookup: %s %s: %d", httpReq.Method, httpReq.URL.Redacted(), resp.Status)
}
