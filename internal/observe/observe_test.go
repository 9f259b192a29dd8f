package observe_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/observe"
)

// silent observes nothing; it stands for a middleware's observer.
type silent struct{ name string }

func (*silent) Claimed(context.Context, *observe.Claim)   {}
func (*silent) Recorded(context.Context, *observe.Record) {}
func (*silent) StartReconcile(ctx context.Context) (context.Context, func(*observe.Reconciled)) {
	return ctx, func(*observe.Reconciled) {}
}

func (*silent) StartPrune(ctx context.Context, _ bool) (context.Context, func(int64, int64, error)) {
	return ctx, func(int64, int64, error) {}
}
func (*silent) Operated(context.Context, *observe.Operation)    {}
func (*silent) Gauged(context.Context, string, *observe.Gauges) {}

// middleware is a middleware that observes by embedding a Source, as the
// telemetry package's does.
type middleware struct{ observe.Source }

func TestOfFindsTheFirstMiddlewareThatObserves(t *testing.T) {
	t.Parallel()

	first, second := &silent{"first"}, &silent{"second"}
	var none *middleware
	got := observe.Of([]any{
		"not a middleware that observes",
		none,          // a nil pointer observes nothing
		&middleware{}, // nor does a middleware without an observer
		&middleware{observe.NewSource(first)},
		&middleware{observe.NewSource(second)},
	})
	require.Same(t, first, got)
	require.Nil(t, observe.Of([]any{"nothing here"}))
}
