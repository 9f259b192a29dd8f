package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/reconcile"
)

// answers is a provider that answers each call with the next of its
// answers, and the last one ever after.
type answers struct {
	calls   atomic.Int64
	answers []func() (json.RawMessage, error)
}

func (a *answers) Call(context.Context, outbox.Request) (json.RawMessage, error) {
	n := int(a.calls.Add(1)) - 1
	return a.answers[min(n, len(a.answers)-1)]()
}

func TestAttemptHistory(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testAttemptHistory[pgx.Tx], testAttemptHistory[*sql.Tx])
}

func testAttemptHistory[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	type testBundle struct {
		client   *outbox.Client[TTx]
		provider *answers
		schema   string
		clock    *atomic.Int64
	}
	setup := func(t *testing.T, answer ...func() (json.RawMessage, error)) *testBundle {
		t.Helper()
		schema := pgoncetest.Schema(t)
		provider := &answers{answers: answer}
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", provider, outbox.IdempotentByKey))
		clock := &atomic.Int64{}
		clock.Store(time.Now().UnixNano())
		client := driver.Client(t, outbox.Config{
			Schema: schema, Registry: registry, WorkerID: "worker-a", Lease: time.Minute,
			NowFunc: func() time.Time { return time.Unix(0, clock.Load()) },
		})
		return &testBundle{client: client, provider: provider, schema: schema, clock: clock}
	}
	ok := func() (json.RawMessage, error) { return json.RawMessage(`{"id":"re_1"}`), nil }
	unavailable := func() (json.RawMessage, error) { return nil, errors.New("503 Service Unavailable") }
	timeout := func() (json.RawMessage, error) { return nil, outbox.Ambiguous(errors.New("timeout after 30s")) }
	call := outbox.Call{RunID: "run-1", Step: 1, Tool: "refund", Args: map[string]any{"order": 8842}}
	kept := func(t *testing.T, b *testBundle) int {
		t.Helper()
		var n int
		require.NoError(t, pgoncetest.Pool(t).QueryRow(t.Context(), `SELECT count(*) FROM `+ident.Quote(b.schema)+`.pgonce_attempt`).Scan(&n))
		return n
	}

	t.Run("FirstTimeSuccessKeepsNoAttempt", func(t *testing.T) {
		t.Parallel()
		b := setup(t, ok)
		res, err := b.client.Do(t.Context(), call, nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, res.State)
		require.Zero(t, kept(t, b), "a first-time success writes no attempt row")

		in, err := b.client.Inspect(t.Context(), res.Key)
		require.NoError(t, err)
		require.Len(t, in.AttemptHistory, 1, "its one attempt, from the key's own times")
		only := in.AttemptHistory[0]
		require.Equal(t, 1, only.Attempt)
		require.Equal(t, outbox.AttemptSucceeded, only.Outcome)
		require.False(t, only.StartedAt.IsZero())
		require.Equal(t, res.CompletedAt, only.EndedAt)
		require.Empty(t, only.Worker)
	})

	t.Run("EveryAttemptOfARetriedKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t, unavailable, timeout, ok)
		key, err := outbox.DeriveKey(call)
		require.NoError(t, err)
		for range 3 {
			b.clock.Add(int64(time.Second))
			// The first two attempts fail to be retried, and say so.
			_, _ = b.client.Do(t.Context(), call, nil)
		}
		in, err := b.client.Inspect(t.Context(), key)
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, in.State)
		require.Equal(t, 3, in.Attempts)
		history := in.AttemptHistory
		require.Len(t, history, 3)
		for i, want := range []struct {
			outcome outbox.AttemptOutcome
			err     string
		}{
			{outbox.AttemptRetry, "503 Service Unavailable"},
			{outbox.AttemptUncertain, "timeout after 30s"},
			{outbox.AttemptSucceeded, ""},
		} {
			got := history[i]
			require.Equal(t, i+1, got.Attempt)
			require.Equal(t, want.outcome, got.Outcome, "attempt %d", i+1)
			require.Contains(t, got.Error, want.err)
			require.Equal(t, "worker-a", got.Worker)
			require.False(t, got.StartedAt.After(got.EndedAt), "attempt %d starts before it ends", i+1)
			if i > 0 {
				require.True(t, got.StartedAt.After(history[i-1].StartedAt), "attempt %d starts after attempt %d", i+1, i)
			}
		}
		require.Equal(t, 3, kept(t, b))
	})

	t.Run("TheAttemptInFlightComesLast", func(t *testing.T) {
		t.Parallel()
		b := setup(t, unavailable)
		res, err := b.client.Do(t.Context(), call, nil)
		require.Error(t, err, "a retry later")
		require.Equal(t, outbox.StatePending, res.State)
		// A dispatcher's claim: the second attempt, in flight.
		_, err = pgoncetest.Pool(t).Exec(t.Context(), `UPDATE `+ident.Quote(b.schema)+`.pgonce_key
			SET attempt = 2, lease_until = now() + interval '1 minute', worker = 'dispatcher-b', updated_at = now()
			WHERE key = $1`, pgoncetest.StoredKey(t, string(res.Key)))
		require.NoError(t, err)
		in, err := b.client.Inspect(t.Context(), res.Key)
		require.NoError(t, err)
		require.Len(t, in.AttemptHistory, 2)
		require.Equal(t, outbox.AttemptRetry, in.AttemptHistory[0].Outcome)
		now := in.AttemptHistory[1]
		require.Equal(t, outbox.AttemptRecord{Attempt: 2, StartedAt: in.UpdatedAt, Worker: "dispatcher-b", Outcome: outbox.AttemptInFlight}, now)
	})

	t.Run("ALeaseThatRanOutIsKept", func(t *testing.T) {
		t.Parallel()
		b := setup(t, ok)
		// An attempt in flight whose worker never came back.
		res, err := b.client.Submit(t.Context(), call)
		require.NoError(t, err)
		_, err = pgoncetest.Pool(t).Exec(t.Context(), `UPDATE `+ident.Quote(b.schema)+`.pgonce_key
			SET attempt = 1, lease_until = now() - interval '1 hour', worker = 'crashed', updated_at = now() - interval '2 hours',
				first_attempted_at = now() - interval '2 hours'
			WHERE key = $1`, pgoncetest.StoredKey(t, string(res.Key)))
		require.NoError(t, err)
		reconciler, err := reconcile.New(b.client, reconcile.Config{Grace: time.Second})
		require.NoError(t, err)
		_, err = reconciler.RunOnce(t.Context())
		require.NoError(t, err)
		// The provider deduplicates on the key: the reconciler sends the
		// key back to pending, and the next attempt succeeds.
		done, err := b.client.Do(t.Context(), call, nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, done.State)
		in, err := b.client.Inspect(t.Context(), res.Key)
		require.NoError(t, err)
		history := in.AttemptHistory
		require.Len(t, history, 3)
		require.Equal(t, outbox.AttemptRecord{
			Attempt: 1, StartedAt: history[0].StartedAt, EndedAt: history[0].EndedAt, Worker: "crashed", Outcome: outbox.AttemptLeaseExpired,
		}, history[0])
		require.True(t, history[0].StartedAt.Before(history[0].EndedAt))
		require.Equal(t, 2, history[1].Attempt, "the reconciler's")
		require.NotEqual(t, "crashed", history[1].Worker)
		require.Equal(t, outbox.AttemptUncertain, history[1].Outcome)
		require.Equal(t, outbox.AttemptRecord{
			Attempt: 3, StartedAt: history[2].StartedAt, EndedAt: in.CompletedAt, Worker: "worker-a", Outcome: outbox.AttemptSucceeded,
		}, history[2])
	})

	t.Run("ATombstoneKeepsItsOutcomeAndDropsItsAttempts", func(t *testing.T) {
		t.Parallel()
		b := setup(t, unavailable, func() (json.RawMessage, error) {
			return nil, outbox.PermanentBody(json.RawMessage(`{"code":"declined"}`), errors.New("declined"))
		})
		key, err := outbox.DeriveKey(call)
		require.NoError(t, err)
		for range 2 {
			_, _ = b.client.Do(t.Context(), call, nil)
		}
		in, err := b.client.Inspect(t.Context(), key)
		require.NoError(t, err)
		require.Equal(t, outbox.StateFailed, in.State)
		require.Empty(t, in.ExpiredFrom, "only a tombstone has one")
		require.Equal(t, 2, kept(t, b))

		b.clock.Add(int64(outbox.RetentionDefault + time.Hour))
		pruned, err := b.client.Prune(t.Context(), nil)
		require.NoError(t, err)
		require.Equal(t, int64(1), pruned.Keys)
		in, err = b.client.Inspect(t.Context(), key)
		require.NoError(t, err)
		require.Equal(t, outbox.StateExpired, in.State)
		require.Equal(t, outbox.StateFailed, in.ExpiredFrom)
		require.Empty(t, in.AttemptHistory)
		require.Zero(t, kept(t, b), "the attempts go with the call")
	})
}
