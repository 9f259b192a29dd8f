package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/pgonce/pgonce/outbox"
)

// Register registers tool in registry for the keys of a [Middleware] whose
// [Config.Tool] it is. Call it while building the registry, before the
// client and the middleware are made; [NewPgx] and [New] refuse a tool it
// did not register, with [ErrToolNotRegistered].
//
// The tool is registered [outbox.ToolOpts.InlineOnly]: only the
// middleware runs its keys, by running the handler for the request in
// hand, and no dispatcher ever claims them. delivery says what the
// reconciler does with a key whose request was abandoned mid-way in
// [ModeLease] (the server was killed, its lease expired):
//
//   - [outbox.AtMostOnce], for handlers whose effects must not be repeated:
//     the key goes to review, and answers 409 needs-review until an
//     operator resolves it;
//   - [outbox.IdempotentByKey], for handlers that pass the key ([Key])
//     downstream to an API that deduplicates on it: the key goes back to
//     pending, and the next request with it runs the handler again; the
//     downstream API answers it as it answered the abandoned one. A 5xx
//     answer of the handler is no outcome there: it is sent, not stored,
//     and the same key runs again. Set opts.KeyRetention to how long that
//     API remembers a key: past it, an abandoned key goes to review
//     instead.
//
// A route of each kind needs a tool, and a middleware, of its own. opts
// may be nil; its InlineOnly is ignored (always true). Register returns an
// error matching [outbox.ErrInvalidRegistration], and registers nothing,
// for another delivery, for what [outbox.Registry.RegisterWithOpts]
// refuses, or for a tool already registered.
//
//	registry := outbox.NewRegistry()
//	if err := idempotency.Register(registry, idempotency.ToolDefault, outbox.AtMostOnce, nil); err != nil {
//		return err
//	}
func Register(registry *outbox.Registry, tool string, delivery outbox.Delivery, opts *outbox.ToolOpts) error {
	if registry == nil {
		return fmt.Errorf("%w: tool %q: registry must not be nil", outbox.ErrInvalidRegistration, tool)
	}
	if delivery != outbox.AtMostOnce && delivery != outbox.IdempotentByKey {
		return fmt.Errorf("%w: tool %q: an HTTP route's delivery is AtMostOnce or IdempotentByKey, not %s",
			outbox.ErrInvalidRegistration, tool, delivery)
	}
	var inline outbox.ToolOpts
	if opts != nil {
		inline = *opts
	}
	inline.InlineOnly = true
	return registry.RegisterWithOpts(tool, notReplayable, delivery, &inline)
}

// notReplayable is the registered provider of the middleware's tools. It is
// never called: the middleware passes the handler to each Do, no dispatcher
// claims an inline-only tool, and the reconciler calls no provider.
var notReplayable = outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
	return nil, outbox.Permanent(errors.New("an HTTP request runs only when its client sends it"))
})

// checkTool reports whether tool is registered in registry as [Register]
// registers it.
func checkTool(registry *outbox.Registry, tool string) error {
	registered := registry.Lookup(tool)
	switch {
	case registered == nil:
		return fmt.Errorf("%w: %w: tool %q is not in the client's registry; register it with idempotency.Register",
			ErrInvalidConfig, ErrToolNotRegistered, tool)
	case !registered.Opts.InlineOnly:
		return fmt.Errorf("%w: %w: tool %q is registered for dispatchers to run; register it with idempotency.Register instead",
			ErrInvalidConfig, ErrToolNotRegistered, tool)
	case registered.Delivery != outbox.AtMostOnce && registered.Delivery != outbox.IdempotentByKey:
		return fmt.Errorf("%w: %w: tool %q is delivered %s; an HTTP route's delivery is AtMostOnce or IdempotentByKey",
			ErrInvalidConfig, ErrToolNotRegistered, tool, registered.Delivery)
	}
	return nil
}
