package store_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/store"
)

// TestAttemptHistory runs a key's attempts through the statements that end
// them and reads back what pgonce_attempt keeps: nothing for a first-time
// success, every attempt of a key that needed more than one, with its
// claim time, worker, outcome and error; nothing for an outcome fenced out;
// and retention deletes the attempts and keeps the tombstone's final state.
func TestAttemptHistory(t *testing.T) {
	t.Parallel()

	for name, open := range drivers(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			s, _ := open(t)
			exec := s.Executor()
			base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
			at := func(d time.Duration) *time.Time {
				now := base.Add(d)
				return &now
			}
			rows := func(key string) int {
				t.Helper()
				var n int
				require.NoError(t, pgoncetest.Pool(t).QueryRow(ctx, `SELECT count(*) FROM `+ident.Quote(s.Schema)+
					`.pgonce_attempt WHERE key = $1`, pgoncetest.StoredKey(t, key)).Scan(&n))
				return n
			}

			// A first-time success writes no attempt.
			first := newKey(1)
			first.Lease, first.Worker, first.Now = time.Minute, "worker-a", at(0)
			_, err := exec.KeyInsert(ctx, first)
			require.NoError(t, err)
			written, err := s.Finish(ctx, &store.FinishParams{Now: at(time.Second), TombstoneRetention: time.Hour, Outcomes: []store.Outcome{
				{Key: first.Key, Scope: first.Scope, Attempt: 1, State: store.StateSucceeded, Response: []byte(`{}`), Retention: time.Minute},
			}})
			require.NoError(t, err)
			require.Equal(t, []string{first.Key}, written)
			require.Zero(t, rows(first.Key), "a key that succeeds at its first attempt pays no attempt row")

			// A refund retried twice, then failed for good.
			refund := newKey(2)
			refund.Lease, refund.Worker, refund.Now = time.Minute, "worker-a", at(0)
			_, err = exec.KeyInsert(ctx, refund)
			require.NoError(t, err)
			written, err = s.Release(ctx, &store.ReleaseParams{Now: at(2 * time.Second), Releases: []store.Release{
				{Key: refund.Key, Scope: refund.Scope, Attempt: 1, LastError: "503 Service Unavailable"},
			}})
			require.NoError(t, err)
			require.Equal(t, []string{refund.Key}, written)
			claimed, err := s.ClaimKey(ctx, &store.ClaimKeyParams{Key: refund.Key, Lease: time.Minute, Worker: "worker-b", Now: at(10 * time.Second)})
			require.NoError(t, err)
			require.Equal(t, 2, claimed.Attempt)
			_, err = s.Release(ctx, &store.ReleaseParams{Now: at(11 * time.Second), Releases: []store.Release{
				{Key: refund.Key, Scope: refund.Scope, Attempt: 2, Ambiguous: true, LastError: "timeout after 30s"},
			}})
			require.NoError(t, err)
			batch, err := s.ClaimBatch(ctx, &store.ClaimBatchParams{Tools: []string{"refund"}, Max: 10, Lease: time.Minute, Worker: "worker-c", Now: at(20 * time.Second)})
			require.NoError(t, err)
			require.Len(t, batch, 1)
			written, err = s.Finish(ctx, &store.FinishParams{Now: at(21 * time.Second), TombstoneRetention: time.Hour, Outcomes: []store.Outcome{
				{Key: refund.Key, Scope: refund.Scope, Attempt: 3, State: store.StateFailed, Failure: []byte(`{"code":"declined"}`), Retention: time.Minute, LastError: "card declined"},
			}})
			require.NoError(t, err)
			require.Equal(t, []string{refund.Key}, written)
			attempts, err := s.Attempts(ctx, refund.Key)
			require.NoError(t, err)
			require.Equal(t, []store.AttemptRecord{
				{Attempt: 1, StartedAt: *at(0), EndedAt: *at(2 * time.Second), Outcome: "retry", Worker: "worker-a", Error: "503 Service Unavailable"},
				{Attempt: 2, StartedAt: *at(10 * time.Second), EndedAt: *at(11 * time.Second), Outcome: "uncertain", Worker: "worker-b", Error: "timeout after 30s"},
				{Attempt: 3, StartedAt: *at(20 * time.Second), EndedAt: *at(21 * time.Second), Outcome: "failed", Worker: "worker-c", Error: "card declined"},
			}, utc(attempts))

			// An attempt whose lease ran out is kept when the reconciler
			// takes the key over, and the late outcome of the worker that
			// lost it writes none.
			lost := newKey(3)
			lost.Lease, lost.Worker, lost.Now = time.Minute, "worker-a", at(0)
			_, err = exec.KeyInsert(ctx, lost)
			require.NoError(t, err)
			reclaimed, err := s.ReclaimExpired(ctx, &store.ReclaimExpiredParams{
				Tools: []string{"refund"}, Grace: time.Second, Max: 10, Lease: time.Minute, Worker: "reconciler", Now: at(5 * time.Minute),
			})
			require.NoError(t, err)
			require.Len(t, reclaimed, 1)
			written, err = s.Finish(ctx, &store.FinishParams{Now: at(6 * time.Minute), TombstoneRetention: time.Hour, Outcomes: []store.Outcome{
				{Key: lost.Key, Scope: lost.Scope, Attempt: 1, State: store.StateSucceeded, Response: []byte(`{}`), Retention: time.Minute},
			}})
			require.NoError(t, err)
			require.Empty(t, written, "fenced out")
			written, err = s.Finish(ctx, &store.FinishParams{Now: at(7 * time.Minute), TombstoneRetention: time.Hour, Outcomes: []store.Outcome{
				{Key: lost.Key, Scope: lost.Scope, Attempt: 2, State: store.StateSucceeded, Response: []byte(`{"found":true}`), Retention: time.Minute},
			}})
			require.NoError(t, err)
			require.Equal(t, []string{lost.Key}, written)
			attempts, err = s.Attempts(ctx, lost.Key)
			require.NoError(t, err)
			require.Equal(t, []store.AttemptRecord{
				{Attempt: 1, StartedAt: *at(0), EndedAt: *at(5 * time.Minute), Outcome: "lease_expired", Worker: "worker-a"},
				{Attempt: 2, StartedAt: *at(5 * time.Minute), EndedAt: *at(7 * time.Minute), Outcome: "succeeded", Worker: "reconciler"},
			}, utc(attempts))

			// Retention turns the keys into tombstones that keep their final
			// state, and deletes their attempts.
			expired, err := s.Expire(ctx, 100, at(24*time.Hour))
			require.NoError(t, err)
			require.Equal(t, int64(3), expired)
			for key, state := range map[string]store.State{first.Key: store.StateSucceeded, refund.Key: store.StateFailed, lost.Key: store.StateSucceeded} {
				require.Zero(t, rows(key))
				var kept string
				require.NoError(t, pgoncetest.Pool(t).QueryRow(ctx, `SELECT expired_state::text FROM `+ident.Quote(s.Schema)+
					`.pgonce_key WHERE key = $1 AND state = 'expired'`, pgoncetest.StoredKey(t, key)).Scan(&kept))
				require.Equal(t, string(state), kept)
			}
		})
	}
}

func utc(attempts []store.AttemptRecord) []store.AttemptRecord {
	for i := range attempts {
		attempts[i].StartedAt = attempts[i].StartedAt.UTC()
		attempts[i].EndedAt = attempts[i].EndedAt.UTC()
	}
	return attempts
}
