package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

// clock is a movable time source for retention tests.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

func TestPrune(t *testing.T) {
	t.Parallel()

	type testBundle struct {
		client   *outbox.Client[pgx.Tx]
		clock    *clock
		provider *countingProvider
		schema   string
	}
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	setup := func(t *testing.T) *testBundle {
		t.Helper()
		schema := pgoncetest.Schema(t)
		clk := &clock{now: start}
		provider := &countingProvider{response: json.RawMessage(`{"ok":true}`)}
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", provider, outbox.IdempotentByKey))
		require.NoError(t, registry.RegisterWithOpts("email", provider, outbox.AtMostOnce,
			&outbox.ToolOpts{Retention: 7 * 24 * time.Hour}))
		client, err := outbox.NewPgx(pgoncetest.Pool(t), outbox.Config{
			Schema: schema, Registry: registry, NowFunc: clk.Now,
		})
		require.NoError(t, err)
		return &testBundle{client: client, clock: clk, provider: provider, schema: schema}
	}

	t.Run("BoundariesAndTombstones", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		call := refundCall("run-retained")
		done, err := bundle.client.Do(t.Context(), call, nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, done.State)
		// Keys that must never be pruned, however old.
		pending, err := bundle.client.Submit(t.Context(), refundCall("run-pending"))
		require.NoError(t, err)
		reviewCall := refundCall("run-review")
		reviewCall.Tool = "email"
		bundle.provider.err = outbox.Ambiguous(errors.New("timeout"))
		review, err := bundle.client.Do(t.Context(), reviewCall, nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateNeedsReview, review.State)
		bundle.provider.err = nil

		// Just before the retention ends: nothing to prune.
		bundle.clock.Set(start.Add(outbox.RetentionDefault - time.Second))
		res, err := bundle.client.Prune(t.Context(), nil)
		require.NoError(t, err)
		require.Equal(t, outbox.PruneResult{}, res)

		// Just after: the finished key becomes a tombstone; the others stay.
		bundle.clock.Set(start.Add(outbox.RetentionDefault + time.Second))
		dry, err := bundle.client.Prune(t.Context(), &outbox.PruneOpts{DryRun: true})
		require.NoError(t, err)
		require.Equal(t, outbox.PruneResult{Keys: 1}, dry)
		res, err = bundle.client.Prune(t.Context(), nil)
		require.NoError(t, err)
		require.Equal(t, outbox.PruneResult{Keys: 1}, res)

		for _, open := range []outbox.Key{pending.Key, review.Key} {
			_, err := bundle.client.Get(t.Context(), open)
			require.NoError(t, err)
		}

		// A late duplicate is refused, and nothing runs again.
		calls := bundle.provider.calls.Load()
		_, err = bundle.client.Do(t.Context(), call, nil)
		var expired *outbox.ExpiredError
		require.ErrorAs(t, err, &expired)
		require.True(t, done.CompletedAt.Equal(expired.CompletedAt))
		_, err = bundle.client.Submit(t.Context(), call)
		require.ErrorIs(t, err, outbox.ErrExpired)
		require.Equal(t, calls, bundle.provider.calls.Load())

		// The tombstone lasts until its horizon after completion.
		bundle.clock.Set(start.Add(outbox.TombstoneRetentionDefault - time.Second))
		res, err = bundle.client.Prune(t.Context(), nil)
		require.NoError(t, err)
		require.Equal(t, outbox.PruneResult{}, res)
		bundle.clock.Set(start.Add(outbox.TombstoneRetentionDefault + time.Second))
		res, err = bundle.client.Prune(t.Context(), nil)
		require.NoError(t, err)
		require.Equal(t, outbox.PruneResult{Tombstones: 1}, res)
		_, err = bundle.client.Get(t.Context(), done.Key)
		require.ErrorIs(t, err, outbox.ErrNotFound)
	})

	t.Run("ToolRetentionApplies", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		call := refundCall("run-email")
		call.Tool = "email"
		_, err := bundle.client.Do(t.Context(), call, nil)
		require.NoError(t, err)
		bundle.clock.Set(start.Add(7*24*time.Hour + time.Second))
		res, err := bundle.client.Prune(t.Context(), nil)
		require.NoError(t, err)
		require.Equal(t, int64(1), res.Keys)
	})

	t.Run("ManyBatches", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		for i := range 25 {
			_, err := bundle.client.Do(t.Context(), outbox.Call{RunID: "bulk", Step: int64(i), Tool: "refund", Args: map[string]any{}}, nil)
			require.NoError(t, err)
		}
		bundle.clock.Set(start.Add(outbox.RetentionDefault + time.Second))
		var progress []outbox.PruneResult
		res, err := bundle.client.Prune(t.Context(), &outbox.PruneOpts{
			BatchSize:    10,
			ProgressFunc: func(r outbox.PruneResult) { progress = append(progress, r) },
		})
		require.NoError(t, err)
		require.Equal(t, int64(25), res.Keys)
		require.Equal(t, []int64{10, 20, 25}, []int64{progress[0].Keys, progress[1].Keys, progress[2].Keys})
	})
}

func TestResolve(t *testing.T) {
	t.Parallel()

	type testBundle struct {
		client   *outbox.Client[pgx.Tx]
		provider *countingProvider
		review   outbox.Key
	}
	setup := func(t *testing.T) *testBundle {
		t.Helper()
		schema := pgoncetest.Schema(t)
		provider := &countingProvider{err: outbox.Ambiguous(errors.New("timeout after send"))}
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("email", provider, outbox.AtMostOnce))
		client, err := outbox.NewPgx(pgoncetest.Pool(t), outbox.Config{Schema: schema, Registry: registry})
		require.NoError(t, err)
		res, err := client.Do(t.Context(), outbox.Call{RunID: "run", Step: 1, Tool: "email", Args: map[string]any{"to": "a@b.c"}}, nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateNeedsReview, res.State)
		return &testBundle{client: client, provider: provider, review: res.Key}
	}

	t.Run("Succeeded", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		response := json.RawMessage(`{ "sent": true }`)
		res, err := bundle.client.Resolve(t.Context(), bundle.review, outbox.Resolution{
			Action: outbox.ResolveSucceeded, Response: response, By: "ops@example.com", Reason: "mail log shows delivery",
		})
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, res.State)
		require.Equal(t, []byte(response), []byte(res.Response))

		inspection, err := bundle.client.Inspect(t.Context(), bundle.review)
		require.NoError(t, err)
		require.Len(t, inspection.Resolutions, 1)
		require.Equal(t, "ops@example.com", inspection.Resolutions[0].By)
		require.Equal(t, "mail log shows delivery", inspection.Resolutions[0].Reason)

		// Resolving again is refused: the key is no longer in review.
		_, err = bundle.client.Resolve(t.Context(), bundle.review, outbox.Resolution{
			Action: outbox.ResolveRetry, By: "ops", Reason: "again",
		})
		var notReview *outbox.NotNeedsReviewError
		require.ErrorAs(t, err, &notReview)
		require.Equal(t, outbox.StateSucceeded, notReview.State)
	})

	t.Run("Failed", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		res, err := bundle.client.Resolve(t.Context(), bundle.review, outbox.Resolution{
			Action: outbox.ResolveFailed, Failure: json.RawMessage(`{"error":"bounced"}`), By: "ops", Reason: "bounce",
		})
		require.NoError(t, err)
		require.Equal(t, outbox.StateFailed, res.State)
		require.JSONEq(t, `{"error":"bounced"}`, string(res.Failure))
	})

	t.Run("RetryRunsAgain", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		res, err := bundle.client.Resolve(t.Context(), bundle.review, outbox.Resolution{
			Action: outbox.ResolveRetry, By: "ops", Reason: "provider confirms nothing was sent",
		})
		require.NoError(t, err)
		require.Equal(t, outbox.StatePending, res.State)

		bundle.provider.err = nil
		bundle.provider.response = json.RawMessage(`{"sent":true}`)
		done, err := bundle.client.Do(t.Context(), outbox.Call{RunID: "run", Step: 1, Tool: "email", Args: map[string]any{"to": "a@b.c"}}, nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, done.State)
		require.Equal(t, int64(2), bundle.provider.calls.Load())
	})

	t.Run("RefusalsChangeNothing", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		for _, bad := range []outbox.Resolution{
			{Action: "maybe", By: "ops", Reason: "r"},
			{Action: outbox.ResolveSucceeded, Response: json.RawMessage(`{not json`), By: "ops", Reason: "r"},
			{Action: outbox.ResolveSucceeded, By: "ops", Reason: "r"},
			{Action: outbox.ResolveFailed, Failure: json.RawMessage(`{}`), Response: json.RawMessage(`{}`), By: "ops", Reason: "r"},
			{Action: outbox.ResolveRetry, By: "", Reason: "r"},
			{Action: outbox.ResolveRetry, By: "ops", Reason: " "},
		} {
			_, err := bundle.client.Resolve(t.Context(), bundle.review, bad)
			require.ErrorIs(t, err, outbox.ErrInvalidResolution, "%+v", bad)
		}
		_, err := bundle.client.Resolve(t.Context(), mustKey(t, refundCall("never")), outbox.Resolution{
			Action: outbox.ResolveRetry, By: "ops", Reason: "r",
		})
		require.ErrorIs(t, err, outbox.ErrNotFound)

		res, err := bundle.client.Get(t.Context(), bundle.review)
		require.NoError(t, err)
		require.Equal(t, outbox.StateNeedsReview, res.State)
		inspection, err := bundle.client.Inspect(t.Context(), bundle.review)
		require.NoError(t, err)
		require.Empty(t, inspection.Resolutions)
	})
}

func TestStats(t *testing.T) {
	t.Parallel()
	config := refundConfig(t)
	client, err := outbox.NewPgx(pgoncetest.Pool(t), config)
	require.NoError(t, err)
	_, err = client.Do(t.Context(), refundCall("done"), nil)
	require.NoError(t, err)
	_, err = client.Submit(t.Context(), refundCall("waiting"))
	require.NoError(t, err)

	stats, err := client.Stats(t.Context())
	require.NoError(t, err)
	require.Equal(t, map[string]map[outbox.State]int64{"refund": {outbox.StateSucceeded: 1, outbox.StatePending: 1}}, stats.Keys)
	require.Equal(t, int64(1), stats.Pending)
	require.Zero(t, stats.InFlight)
	require.Zero(t, stats.Tombstones)
}

// A duplicate that races with pruning meets the tombstone, never a gap: the
// tombstone is the key's own row, so the unique index holds through pruning.
func TestDuplicateRacingPruneNeverRunsAgain(t *testing.T) {
	t.Parallel()
	schema := pgoncetest.Schema(t)
	provider := &countingProvider{response: json.RawMessage(`{"ok":true}`)}
	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("refund", provider, outbox.IdempotentByKey))
	client, err := outbox.NewPgx(pgoncetest.Pool(t), outbox.Config{Schema: schema, Registry: registry})
	require.NoError(t, err)
	call := refundCall("run-race-prune")
	done, err := client.Do(t.Context(), call, nil)
	require.NoError(t, err)

	// Pruning, caught mid-way: the key is being turned into a tombstone by
	// a transaction that has not committed.
	pruner, err := pgoncetest.Pool(t).Begin(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { _ = pruner.Rollback(context.Background()) })
	_, err = pruner.Exec(t.Context(), pgoncetest.TombstoneStatement(schema), pgoncetest.StoredKey(t, string(done.Key)), nil)
	require.NoError(t, err)

	type outcome struct {
		res outbox.Result
		err error
	}
	racing := make(chan outcome, 1)
	go func() {
		res, err := client.Submit(context.Background(), call)
		racing <- outcome{res, err}
	}()
	// Whether the duplicate waits for the pruner or answers at once, it
	// never creates the key again.
	commitErr := make(chan error, 1)
	go func() { commitErr <- pruner.Commit(context.Background()) }()
	require.NoError(t, <-commitErr)
	got := <-racing
	if got.err != nil {
		require.ErrorIs(t, got.err, outbox.ErrExpired)
	} else {
		require.False(t, got.res.Created)
		require.True(t, got.res.Replayed())
	}

	_, err = client.Submit(t.Context(), call)
	require.ErrorIs(t, err, outbox.ErrExpired)
	_, err = client.Do(t.Context(), call, nil)
	require.ErrorIs(t, err, outbox.ErrExpired)
	require.Equal(t, int64(1), provider.calls.Load())
	keys, rows := rowCounts(t, schema)
	require.Equal(t, 1, keys)
	require.Zero(t, rows)
}
