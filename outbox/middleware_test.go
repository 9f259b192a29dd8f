package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
)

type middlewareCtxKey struct{}

// recordingMiddleware records what it sees, and adds its name to the
// context's trail before going on.
type recordingMiddleware struct {
	name string
	mu   sync.Mutex
	seen []middlewareSeen
}

type middlewareSeen struct {
	call    outbox.ProviderCall
	outcome outbox.ProviderOutcome
}

func (m *recordingMiddleware) AroundProvider(ctx context.Context, call *outbox.ProviderCall, next func(ctx context.Context) outbox.ProviderResult) outbox.ProviderResult {
	trail, _ := ctx.Value(middlewareCtxKey{}).([]string)
	ctx = context.WithValue(ctx, middlewareCtxKey{}, append(append([]string(nil), trail...), m.name))
	res := next(ctx)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.seen = append(m.seen, middlewareSeen{call: *call, outcome: res.Outcome})
	return res
}

func (m *recordingMiddleware) Seen() []middlewareSeen {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]middlewareSeen(nil), m.seen...)
}

func TestMiddleware(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testMiddleware, testMiddleware)
}

func testMiddleware[TTx any](t *testing.T, d drivertest.Driver[TTx]) {
	t.Helper()

	t.Run("WrapsDoClientOutsideToolAndSeesTheCall", func(t *testing.T) {
		t.Parallel()
		outer, inner := &recordingMiddleware{name: "client"}, &recordingMiddleware{name: "tool"}
		var providerTrail []string
		registry := outbox.NewRegistry()
		require.NoError(t, registry.RegisterWithOpts("refund", outbox.ProviderFunc(func(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
			providerTrail, _ = ctx.Value(middlewareCtxKey{}).([]string)
			return json.RawMessage(`{"refund":"re_1"}`), nil
		}), outbox.IdempotentByKey, &outbox.ToolOpts{Middleware: []outbox.Middleware{inner}}))
		client := d.Client(t, outbox.Config{Schema: pgoncetest.Schema(t), Registry: registry, Middleware: []outbox.Middleware{outer}})

		call := outbox.Call{RunID: "run-1", Step: 1, Tool: "refund", Args: map[string]any{"order": 8842}, Metadata: map[string]string{"traceparent": "00-abc"}}
		res, err := client.Do(t.Context(), call, nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, res.State)
		require.Equal(t, []string{"client", "tool"}, providerTrail)

		for _, m := range []*recordingMiddleware{outer, inner} {
			seen := m.Seen()
			require.Len(t, seen, 1)
			require.Equal(t, outbox.ProviderOpCall, seen[0].call.Op)
			require.Equal(t, res.Key, seen[0].call.Request.Key)
			require.Equal(t, "refund", seen[0].call.Request.Tool)
			require.Equal(t, 1, seen[0].call.Request.Attempt)
			require.Equal(t, outbox.IdempotentByKey, seen[0].call.Delivery)
			require.Equal(t, map[string]string{"traceparent": "00-abc"}, seen[0].call.Request.Metadata)
			require.Equal(t, outbox.ProviderSucceeded, seen[0].outcome)
		}

		// A replay calls no provider, and so no middleware.
		_, err = client.Do(t.Context(), call, nil)
		require.NoError(t, err)
		require.Len(t, outer.Seen(), 1)
	})

	t.Run("RefusesWithoutCallingTheProvider", func(t *testing.T) {
		t.Parallel()
		provider := &countingProvider{}
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", provider, outbox.AtMostOnce))
		refusing := outbox.MiddlewareFunc(func(ctx context.Context, call *outbox.ProviderCall, next func(ctx context.Context) outbox.ProviderResult) outbox.ProviderResult {
			if call.Request.Metadata["tenant_blocked"] == "yes" {
				return outbox.ProviderResult{Err: outbox.Permanent(errors.New("tenant blocked"))}
			}
			return next(ctx)
		})
		outer := &recordingMiddleware{name: "outer"}
		client := d.Client(t, outbox.Config{Schema: pgoncetest.Schema(t), Registry: registry, Middleware: []outbox.Middleware{outer, refusing}})

		res, err := client.Do(t.Context(), outbox.Call{RunID: "run-1", Step: 1, Tool: "refund", Args: map[string]any{"order": 1}, Metadata: map[string]string{"tenant_blocked": "yes"}}, nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateFailed, res.State)
		require.JSONEq(t, `{"error":"tenant blocked"}`, string(res.Failure))
		require.Zero(t, provider.calls.Load())
		require.Equal(t, outbox.ProviderFailed, outer.Seen()[0].outcome)

		res, err = client.Do(t.Context(), outbox.Call{RunID: "run-1", Step: 2, Tool: "refund", Args: map[string]any{"order": 2}}, nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, res.State)
		require.Equal(t, int64(1), provider.calls.Load())
	})

	t.Run("SeesOutcomesOfFailuresAndLookups", func(t *testing.T) {
		t.Parallel()
		provider := &lookupProvider{}
		provider.err = outbox.Ambiguous(errors.New("timeout after send"))
		recorder := &recordingMiddleware{name: "rec"}
		registry := outbox.NewRegistry()
		require.NoError(t, registry.RegisterWithOpts("provision", provider, outbox.LookupByNaturalID, &outbox.ToolOpts{Middleware: []outbox.Middleware{recorder}}))
		client := d.Client(t, outbox.Config{Schema: pgoncetest.Schema(t), Registry: registry})

		call := outbox.Call{RunID: "run-1", Step: 1, Tool: "provision", NaturalID: "vm-42", Args: map[string]any{"size": "m"}}
		_, err := client.Do(t.Context(), call, nil)
		require.ErrorIs(t, err, outbox.ErrProviderFailed)
		provider.found = json.RawMessage(`{"vm":"vm-42"}`)
		res, err := client.Do(t.Context(), call, nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, res.State)

		seen := recorder.Seen()
		require.Len(t, seen, 2)
		require.Equal(t, outbox.ProviderOpCall, seen[0].call.Op)
		require.Equal(t, outbox.ProviderAmbiguous, seen[0].outcome)
		require.Equal(t, outbox.LookupByNaturalID, seen[0].call.Delivery)
		require.Equal(t, outbox.ProviderOpLookup, seen[1].call.Op)
		require.Equal(t, 2, seen[1].call.Request.Attempt)
		require.Equal(t, "vm-42", seen[1].call.Request.NaturalID)
		require.Equal(t, outbox.ProviderFound, seen[1].outcome)
	})

	t.Run("PanicInMiddlewareIsTheProvidersPanic", func(t *testing.T) {
		t.Parallel()
		provider := &countingProvider{}
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", provider, outbox.AtMostOnce))
		var panics atomic.Int64
		client := d.Client(t, outbox.Config{Schema: pgoncetest.Schema(t), Registry: registry, Middleware: []outbox.Middleware{
			outbox.MiddlewareFunc(func(ctx context.Context, call *outbox.ProviderCall, next func(ctx context.Context) outbox.ProviderResult) outbox.ProviderResult {
				_ = next(ctx)
				panics.Add(1)
				panic("middleware broke after the call")
			}),
		}})
		res, err := client.Do(t.Context(), outbox.Call{RunID: "run-1", Step: 1, Tool: "refund", Args: map[string]any{"order": 1}}, nil)
		require.NoError(t, err)
		// The provider may have acted: an at-most-once tool goes to review.
		require.Equal(t, outbox.StateNeedsReview, res.State)
		require.Equal(t, int64(1), provider.calls.Load())
		require.Equal(t, int64(1), panics.Load())
	})

	t.Run("NilMiddlewareIsRefused", func(t *testing.T) {
		t.Parallel()
		_, _, err := d.Open(d.Pool(t), outbox.Config{Schema: pgoncetest.Schema(t), Middleware: []outbox.Middleware{nil}})
		require.ErrorIs(t, err, outbox.ErrInvalidConfig)
		registry := outbox.NewRegistry()
		err = registry.RegisterWithOpts("refund", &countingProvider{}, outbox.IdempotentByKey, &outbox.ToolOpts{Middleware: []outbox.Middleware{nil}})
		require.ErrorIs(t, err, outbox.ErrInvalidRegistration)
		require.Nil(t, registry.Lookup("refund"))
	})
}
