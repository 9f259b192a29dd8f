package oncetest_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/oncetest"
	"github.com/pgonce/pgonce/outbox"
)

// TestDrainTransactional checks that Drain runs a transactional tool as
// a dispatcher does, with the client's middleware around its provider and
// its flow control honoured.
func TestDrainTransactional(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testDrainTransactional[pgx.Tx], testDrainTransactional[*sql.Tx])
}

func testDrainTransactional[TTx any](t *testing.T, d drivertest.Driver[TTx]) {
	type testBundle struct {
		client *outbox.Client[TTx]
		table  string
		mu     *sync.Mutex
		seen   []outbox.ProviderOutcome
		calls  []outbox.Call
	}
	// setup serves "credit" as a transactional tool whose provider fails
	// its first attempt of every key after writing its effect.
	setup := func(t *testing.T) *testBundle {
		t.Helper()
		schema := testSchema(t, d)
		bundle := &testBundle{table: pgoncetest.EffectTable(t, schema), mu: &sync.Mutex{}}
		provider := drivertest.EffectProvider[TTx](bundle.table, func(_ context.Context, req outbox.Request) (json.RawMessage, error) {
			if req.Attempt == 1 {
				return nil, errors.New("first attempt fails after its effect")
			}
			return json.RawMessage(`{"credited":true}`), nil
		})
		registry := outbox.NewRegistry()
		require.NoError(t, outbox.RegisterTx(registry, "credit", provider, nil))
		middleware := outbox.MiddlewareFunc(func(ctx context.Context, call *outbox.ProviderCall, next func(context.Context) outbox.ProviderResult) outbox.ProviderResult {
			res := next(ctx)
			bundle.mu.Lock()
			defer bundle.mu.Unlock()
			require.Equal(t, outbox.Transactional, call.Delivery)
			bundle.seen = append(bundle.seen, res.Outcome)
			return res
		})
		bundle.client = d.Client(t, outbox.Config{Schema: schema, Registry: registry, Middleware: []outbox.Middleware{middleware}})
		for i := range 5 {
			bundle.calls = append(bundle.calls, outbox.Call{RunID: "run", Step: int64(i + 1), Tool: "credit", Args: map[string]any{"amount": i}})
		}
		return bundle
	}

	t.Run("EveryKeyWritesItsEffectOnce", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		keys := d.SubmitKeys(t, bundle.client, bundle.calls)

		res, err := oncetest.Drain(t.Context(), bundle.client, &oncetest.DrainOpts{BackoffFunc: func(int) time.Duration { return 0 }})
		require.NoError(t, err)
		require.Equal(t, len(keys), res.Succeeded)
		require.Equal(t, len(keys), res.Retried)
		for _, key := range keys {
			require.Equal(t, 1, pgoncetest.CountEffects(t, bundle.table, key), "key %s", key)
		}
		bundle.mu.Lock()
		defer bundle.mu.Unlock()
		require.Len(t, bundle.seen, 2*len(keys))
		require.ElementsMatch(t, slices.Concat(slices.Repeat([]outbox.ProviderOutcome{outbox.ProviderRetry}, len(keys)), slices.Repeat([]outbox.ProviderOutcome{outbox.ProviderSucceeded}, len(keys))), bundle.seen)
	})

	t.Run("PausedToolIsNotClaimed", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		keys := d.SubmitKeys(t, bundle.client, bundle.calls)
		_, err := bundle.client.Pause(t.Context(), "credit", outbox.PauseParams{By: "test", Reason: "maintenance"})
		require.NoError(t, err)

		res, err := oncetest.Drain(t.Context(), bundle.client, nil)
		require.NoError(t, err)
		require.Zero(t, res.Attempts())
		for _, key := range keys {
			require.Zero(t, pgoncetest.CountEffects(t, bundle.table, key))
		}
	})
}
