package oncetest_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/oncetest"
	"github.com/pgonce/pgonce/outbox"
)

// TestDrainFlowControl checks that Drain honours a tool's flow control as a
// dispatcher does: it claims through the dispatcher's claim.
func TestDrainFlowControl(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testDrainFlowControl[pgx.Tx], testDrainFlowControl[*sql.Tx])
}

func testDrainFlowControl[TTx any](t *testing.T, d drivertest.Driver[TTx]) {
	type testBundle struct {
		client  *outbox.Client[TTx]
		clock   *oncetest.Clock
		refunds *oncetest.Recorder
		mails   *oncetest.Recorder
	}
	setup := func(t *testing.T) *testBundle {
		t.Helper()
		bundle := &testBundle{
			clock:   oncetest.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)),
			refunds: &oncetest.Recorder{},
			mails:   &oncetest.Recorder{},
		}
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", bundle.refunds, outbox.IdempotentByKey))
		require.NoError(t, registry.Register("email", bundle.mails, outbox.AtMostOnce))
		bundle.client = d.Client(t, outbox.Config{Schema: testSchema(t, d), Registry: registry, NowFunc: bundle.clock.Now})
		return bundle
	}
	refunds := func(n int) []outbox.Call {
		calls := make([]outbox.Call, n)
		for i := range calls {
			calls[i] = refund("run-"+string(rune('a'+i)), i+1)
		}
		return calls
	}
	mail := outbox.Call{RunID: "run-mail", Step: 1, Tool: "email", Args: map[string]any{"to": "a@example.com"}}
	requireStates := func(t *testing.T, client *outbox.Client[TTx], keys []outbox.Key, want outbox.State) {
		t.Helper()
		for _, key := range keys {
			got, err := client.Get(t.Context(), key)
			require.NoError(t, err)
			require.Equal(t, want, got.State, "key %s", key)
		}
	}

	t.Run("LeavesAPausedToolsKeysPending", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		keys := d.SubmitKeys(t, bundle.client, refunds(2))
		mailKey := d.SubmitKeys(t, bundle.client, []outbox.Call{mail})[0]
		_, err := bundle.client.Pause(t.Context(), "refund", outbox.PauseParams{By: "alice", Reason: "provider incident"})
		require.NoError(t, err)

		res, err := oncetest.Drain(t.Context(), bundle.client, nil)
		require.NoError(t, err)
		require.Equal(t, oncetest.DrainResult{Keys: []outbox.Key{mailKey}, Succeeded: 1}, res)
		require.Empty(t, bundle.refunds.Calls())
		requireStates(t, bundle.client, keys, outbox.StatePending)

		_, err = bundle.client.Resume(t.Context(), "refund", outbox.ResumeParams{By: "alice"})
		require.NoError(t, err)
		res, err = oncetest.Drain(t.Context(), bundle.client, nil)
		require.NoError(t, err)
		require.ElementsMatch(t, keys, res.Keys)
		requireStates(t, bundle.client, keys, outbox.StateSucceeded)
	})

	t.Run("HonoursAPauseAProviderMakesWithinTheDrain", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		// The mail's provider pauses refunds, then submits some: the
		// Drain's next claim reads the pause and leaves them out.
		var (
			mu   sync.Mutex
			keys []outbox.Key
		)
		bundle.mails.RespondFunc = func(ctx context.Context, _ outbox.Request) (json.RawMessage, error) {
			if _, err := bundle.client.Pause(ctx, "refund", outbox.PauseParams{By: "mailer", Reason: "test"}); err != nil {
				return nil, err
			}
			for _, call := range refunds(2) {
				res, err := bundle.client.Submit(ctx, call)
				if err != nil {
					return nil, err
				}
				mu.Lock()
				keys = append(keys, res.Key)
				mu.Unlock()
			}
			return json.RawMessage(`{}`), nil
		}
		mailKey := d.SubmitKeys(t, bundle.client, []outbox.Call{mail})[0]

		res, err := oncetest.Drain(t.Context(), bundle.client, nil)
		require.NoError(t, err)
		require.Equal(t, []outbox.Key{mailKey}, res.Keys)
		require.Empty(t, bundle.refunds.Calls())
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, keys, 2)
		requireStates(t, bundle.client, keys, outbox.StatePending)
	})

	t.Run("ARateWithBurstNMakesNCallsWhileTheClockStandsStill", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		_, err := bundle.client.SetToolLimits(t.Context(), "refund", outbox.ToolLimits{Rate: 1, Burst: 3},
			outbox.LimitParams{By: "alice", Reason: "provider limit"})
		require.NoError(t, err)
		keys := d.SubmitKeys(t, bundle.client, refunds(5))
		mailKey := d.SubmitKeys(t, bundle.client, []outbox.Call{mail})[0]

		res, err := oncetest.Drain(t.Context(), bundle.client, nil)
		require.NoError(t, err)
		require.Equal(t, 4, res.Succeeded, "the burst of refunds and the unlimited mail")
		require.Contains(t, res.Keys, mailKey)
		require.Len(t, bundle.refunds.Calls(), 3)

		// No token accrues while the clock stands still.
		res, err = oncetest.Drain(t.Context(), bundle.client, nil)
		require.NoError(t, err)
		require.Zero(t, res.Attempts())

		// One a second, by the client's clock.
		bundle.clock.Advance(time.Second)
		res, err = oncetest.Drain(t.Context(), bundle.client, nil)
		require.NoError(t, err)
		require.Equal(t, 1, res.Succeeded)
		bundle.clock.Advance(time.Second)
		res, err = oncetest.Drain(t.Context(), bundle.client, nil)
		require.NoError(t, err)
		require.Equal(t, 1, res.Succeeded)
		requireStates(t, bundle.client, keys, outbox.StateSucceeded)
	})

	t.Run("NeverHoldsMoreInFlightThanTheLimit", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		_, err := bundle.client.SetToolLimits(t.Context(), "refund", outbox.ToolLimits{MaxInFlight: 2},
			outbox.LimitParams{By: "alice", Reason: "provider limit"})
		require.NoError(t, err)
		var (
			mu          sync.Mutex
			maxInFlight int64
		)
		// Drain runs one call at a time, but the keys it claimed and has not
		// run yet are in flight too: the limit bounds them all.
		bundle.refunds.RespondFunc = func(ctx context.Context, _ outbox.Request) (json.RawMessage, error) {
			stats, err := bundle.client.Stats(ctx)
			if err != nil {
				return nil, err
			}
			mu.Lock()
			defer mu.Unlock()
			maxInFlight = max(maxInFlight, stats.Keys["refund"][outbox.StateInFlight])
			return json.RawMessage(oncetest.RecorderResponseDefault), nil
		}
		keys := d.SubmitKeys(t, bundle.client, refunds(5))

		res, err := oncetest.Drain(t.Context(), bundle.client, nil)
		require.NoError(t, err)
		require.Equal(t, 5, res.Succeeded, "the limit bounds the keys in flight, not the Drain")
		requireStates(t, bundle.client, keys, outbox.StateSucceeded)
		mu.Lock()
		defer mu.Unlock()
		require.Positive(t, maxInFlight)
		require.LessOrEqual(t, maxInFlight, int64(2))
	})
	t.Run("SlowsTheToolDownWhenItsProviderAsks", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		// One refund in flight at a time, so that the Drain claims the
		// refunds after the first one's slow down.
		_, err := bundle.client.SetToolLimits(t.Context(), "refund", outbox.ToolLimits{MaxInFlight: 1},
			outbox.LimitParams{By: "alice", Reason: "provider limit"})
		require.NoError(t, err)
		var (
			mu     sync.Mutex
			slowed bool
		)
		bundle.refunds.RespondFunc = func(context.Context, outbox.Request) (json.RawMessage, error) {
			mu.Lock()
			defer mu.Unlock()
			if !slowed {
				slowed = true
				return nil, outbox.SlowDown(errors.New("429 Too Many Requests"), 10*time.Second)
			}
			return json.RawMessage(oncetest.RecorderResponseDefault), nil
		}
		keys := d.SubmitKeys(t, bundle.client, refunds(3))
		mailKey := d.SubmitKeys(t, bundle.client, []outbox.Call{mail})[0]

		// MaxAttempts 1: an attempt spent by the slow down would fail the key.
		opts := &oncetest.DrainOpts{MaxAttempts: 1}
		res, err := oncetest.Drain(t.Context(), bundle.client, opts)
		require.NoError(t, err)
		require.Len(t, bundle.refunds.Calls(), 1, "no refund is called while the tool is slowed down")
		require.Equal(t, 1, res.Retried)
		require.Equal(t, 1, res.Succeeded)
		require.Contains(t, res.Keys, mailKey)
		requireStates(t, bundle.client, keys, outbox.StatePending)
		status, err := bundle.client.Tool(t.Context(), "refund")
		require.NoError(t, err)
		require.True(t, status.SlowedDown(bundle.clock.Now()))

		bundle.clock.Advance(10*time.Second + time.Millisecond)
		res, err = oncetest.Drain(t.Context(), bundle.client, opts)
		require.NoError(t, err)
		require.Equal(t, 3, res.Succeeded)
		requireStates(t, bundle.client, keys, outbox.StateSucceeded)
		for _, key := range keys {
			got, err := bundle.client.Get(t.Context(), key)
			require.NoError(t, err)
			require.Equal(t, 1, got.Attempts, "the slow down spent no attempt of key %s", key)
		}
	})
}
