package store_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/store"
)

// TestSettleReview runs the late outcome of an attempt that the reconciler
// took over and sent to review: it settles the review, once, and is
// recorded as a resolution; it leaves alone a key an operator decided, a
// key attempted again since, a review for another reason, a review that was
// no takeover of its attempt, and an outcome that is not final.
func TestSettleReview(t *testing.T) {
	t.Parallel()

	const reason = "lease expired: the attempt's outcome is unknown"
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
			// scopeOf is the scope newKey gives the key it names.
			scopeOf := func(key string) string {
				n, err := strconv.ParseInt(strings.TrimPrefix(key, "k1_"), 10, 64)
				if err != nil {
					panic(err)
				}
				return fmt.Sprintf("%064x", n)
			}
			// takenOver inserts key n in flight at attempt 1 for a worker,
			// lets the reconciler take it over at attempt 2 after its
			// lease, and sends it to review for why, as the reconciler does
			// for an at-most-once tool.
			takenOver := func(t *testing.T, n int, why string) string {
				t.Helper()
				key := newKey(n)
				// A tool of its own: the subtests run in parallel in one
				// schema, and each reclaims its key alone.
				key.Tool = fmt.Sprintf("refund_%d", n)
				key.Lease, key.Worker, key.Now = time.Minute, "worker", at(0)
				_, err := exec.KeyInsert(ctx, key)
				require.NoError(t, err)
				reclaimed, err := s.ReclaimExpired(ctx, &store.ReclaimExpiredParams{
					Tools: []string{key.Tool}, Grace: time.Second, Max: 100, Lease: time.Minute, Worker: "reconciler", Now: at(5 * time.Minute),
				})
				require.NoError(t, err)
				require.Len(t, reclaimed, 1)
				written, err := s.Finish(ctx, &store.FinishParams{Now: at(5 * time.Minute), TombstoneRetention: time.Hour, Outcomes: []store.Outcome{
					{Key: key.Key, Scope: scopeOf(key.Key), Attempt: 2, State: store.StateNeedsReview, LastError: why},
				}})
				require.NoError(t, err)
				require.Equal(t, []string{key.Key}, written)
				return key.Key
			}
			late := func(key string, attempt int) *store.SettleReviewParams {
				return &store.SettleReviewParams{
					Outcome: store.Outcome{
						Key: key, Attempt: attempt, State: store.StateSucceeded, Response: []byte(`{"refund":"r_1"}`), Retention: time.Hour,
					},
					ReviewReason: reason, TombstoneRetention: 2 * time.Hour,
					ResolvedBy: "pgonce", Reason: "the answer of attempt 1 came after its lease", Now: at(6 * time.Minute),
				}
			}
			state := func(t *testing.T, key string) store.State {
				t.Helper()
				row, err := exec.KeyGet(ctx, key, nil)
				require.NoError(t, err)
				return store.State(row.State)
			}

			t.Run("SettlesTheReviewOnce", func(t *testing.T) {
				t.Parallel()
				key := takenOver(t, 1, reason)
				written, err := s.Finish(ctx, &store.FinishParams{Now: at(6 * time.Minute), TombstoneRetention: time.Hour, Outcomes: []store.Outcome{
					{Key: key, Scope: scopeOf(key), Attempt: 1, State: store.StateSucceeded, Response: []byte(`{"refund":"r_1"}`), Retention: time.Hour},
				}})
				require.NoError(t, err)
				require.Empty(t, written, "fenced out")

				settled, err := s.SettleReview(ctx, late(key, 1))
				require.NoError(t, err)
				require.True(t, settled)
				row, err := exec.KeyGet(ctx, key, nil)
				require.NoError(t, err)
				require.Equal(t, store.StateSucceeded, store.State(row.State))
				require.JSONEq(t, `{"refund":"r_1"}`, string(row.Response))
				var completed, expires, forget time.Time
				var lastError *string
				require.NoError(t, pgoncetest.Pool(t).QueryRow(ctx, `SELECT completed_at, expires_at, forget_at, last_error FROM `+
					ident.Quote(s.Schema)+`.pgonce_key WHERE key = $1`, pgoncetest.StoredKey(t, key)).Scan(&completed, &expires, &forget, &lastError))
				require.Equal(t, *at(6 * time.Minute), completed.UTC())
				require.Equal(t, *at(6*time.Minute + time.Hour), expires.UTC())
				require.Equal(t, *at(6*time.Minute + 2*time.Hour), forget.UTC())
				require.Nil(t, lastError, "a success keeps no error")

				resolutions, err := s.ResolutionsByKey(ctx, key)
				require.NoError(t, err)
				require.Len(t, resolutions, 1)
				require.Equal(t, string(store.StateSucceeded), resolutions[0].Action)
				require.Equal(t, "pgonce", resolutions[0].ResolvedBy)
				require.Equal(t, "the answer of attempt 1 came after its lease", resolutions[0].Reason)
				attempts, err := s.Attempts(ctx, key)
				require.NoError(t, err)
				require.Equal(t, []string{"lease_expired", "needs_review"}, outcomes(attempts), "the history of the attempts stands")

				settled, err = s.SettleReview(ctx, late(key, 1))
				require.NoError(t, err)
				require.False(t, settled, "settled already")
			})

			t.Run("SettlesAKeyTheReconcilerHoldsUndecided", func(t *testing.T) {
				t.Parallel()
				key := newKey(3)
				key.Tool = "refund_3"
				key.Lease, key.Worker, key.Now = time.Minute, "worker", at(0)
				_, err := exec.KeyInsert(ctx, key)
				require.NoError(t, err)
				reclaimed, err := s.ReclaimExpired(ctx, &store.ReclaimExpiredParams{
					Tools: []string{key.Tool}, Grace: time.Second, Max: 100, Lease: time.Minute, Worker: "reconciler", Now: at(5 * time.Minute),
				})
				require.NoError(t, err)
				require.Len(t, reclaimed, 1)

				settled, err := s.SettleReview(ctx, late(key.Key, 1))
				require.NoError(t, err)
				require.True(t, settled)
				require.Equal(t, store.StateSucceeded, state(t, key.Key))
				written, err := s.Finish(ctx, &store.FinishParams{Now: at(6 * time.Minute), TombstoneRetention: time.Hour, Outcomes: []store.Outcome{
					{Key: key.Key, Scope: scopeOf(key.Key), Attempt: 2, State: store.StateNeedsReview, LastError: reason},
				}})
				require.NoError(t, err)
				require.Empty(t, written, "the reconciler's review is fenced out")
				require.Equal(t, store.StateSucceeded, state(t, key.Key))
			})

			t.Run("SettlesWithAFailure", func(t *testing.T) {
				t.Parallel()
				key := takenOver(t, 2, reason)
				p := late(key, 1)
				p.Outcome.State, p.Outcome.Response, p.Outcome.Failure, p.Outcome.LastError = store.StateFailed, nil, []byte(`{"code":"declined"}`), "card declined"
				settled, err := s.SettleReview(ctx, p)
				require.NoError(t, err)
				require.True(t, settled)
				row, err := exec.KeyGet(ctx, key, nil)
				require.NoError(t, err)
				require.Equal(t, store.StateFailed, store.State(row.State))
				require.JSONEq(t, `{"code":"declined"}`, string(row.Failure))
			})

			t.Run("LeavesAKeyAnOperatorDecided", func(t *testing.T) {
				t.Parallel()
				for i, action := range []string{"retry", "failed"} {
					key := takenOver(t, 10+i, reason)
					var failure []byte
					if action == "failed" {
						failure = []byte(`{"by":"operator"}`)
					}
					require.NoError(t, s.Resolve(ctx, &store.ResolveParams{
						Key: key, Action: action, Failure: failure, Retention: time.Hour, TombstoneRetention: time.Hour,
						ResolvedBy: "alice", Reason: "checked the bank", Now: at(6 * time.Minute),
					}))
					before := state(t, key)
					settled, err := s.SettleReview(ctx, late(key, 1))
					require.NoError(t, err)
					require.False(t, settled, action)
					require.Equal(t, before, state(t, key), action)
				}
			})

			t.Run("LeavesAKeyAttemptedSince", func(t *testing.T) {
				t.Parallel()
				key := takenOver(t, 20, reason)
				require.NoError(t, s.Resolve(ctx, &store.ResolveParams{
					Key: key, Action: "retry", ResolvedBy: "alice", Reason: "try again", Now: at(6 * time.Minute),
				}))
				claimed, err := s.ClaimKey(ctx, &store.ClaimKeyParams{Key: key, Lease: time.Minute, Worker: "worker", Now: at(7 * time.Minute)})
				require.NoError(t, err)
				require.Equal(t, 3, claimed.Attempt)
				written, err := s.Finish(ctx, &store.FinishParams{Now: at(7 * time.Minute), TombstoneRetention: time.Hour, Outcomes: []store.Outcome{
					{Key: key, Scope: scopeOf(key), Attempt: 3, State: store.StateNeedsReview, LastError: reason},
				}})
				require.NoError(t, err)
				require.Equal(t, []string{key}, written)
				for _, attempt := range []int{1, 2} {
					settled, err := s.SettleReview(ctx, late(key, attempt))
					require.NoError(t, err)
					require.False(t, settled, "attempt %d", attempt)
				}
				require.Equal(t, store.StateNeedsReview, state(t, key))
			})

			t.Run("LeavesAReviewForAnotherReason", func(t *testing.T) {
				t.Parallel()
				key := takenOver(t, 30, "succeeded outcome could not be recorded: invalid byte sequence")
				settled, err := s.SettleReview(ctx, late(key, 1))
				require.NoError(t, err)
				require.False(t, settled)
				require.Equal(t, store.StateNeedsReview, state(t, key))
			})

			t.Run("LeavesAReviewThatWasNoTakeover", func(t *testing.T) {
				t.Parallel()
				// Attempt 1 was released (nothing done), attempt 2 went to
				// review with the same text: attempt 1's outcome is not late.
				key := newKey(40)
				key.Lease, key.Worker, key.Now = time.Minute, "worker", at(0)
				_, err := exec.KeyInsert(ctx, key)
				require.NoError(t, err)
				_, err = s.Release(ctx, &store.ReleaseParams{Now: at(time.Second), Releases: []store.Release{{Key: key.Key, Scope: scopeOf(key.Key), Attempt: 1, LastError: "503"}}})
				require.NoError(t, err)
				claimed, err := s.ClaimKey(ctx, &store.ClaimKeyParams{Key: key.Key, Lease: time.Minute, Worker: "worker", Now: at(2 * time.Second)})
				require.NoError(t, err)
				require.Equal(t, 2, claimed.Attempt)
				_, err = s.Finish(ctx, &store.FinishParams{Now: at(3 * time.Second), TombstoneRetention: time.Hour, Outcomes: []store.Outcome{
					{Key: key.Key, Scope: scopeOf(key.Key), Attempt: 2, State: store.StateNeedsReview, LastError: reason},
				}})
				require.NoError(t, err)
				settled, err := s.SettleReview(ctx, late(key.Key, 1))
				require.NoError(t, err)
				require.False(t, settled)
				require.Equal(t, store.StateNeedsReview, state(t, key.Key))
			})

			t.Run("LeavesTheKeyForAnOutcomeThatIsNotFinal", func(t *testing.T) {
				t.Parallel()
				key := takenOver(t, 50, reason)
				p := late(key, 1)
				p.Outcome.State, p.Outcome.Response = store.StateNeedsReview, nil
				settled, err := s.SettleReview(ctx, p)
				require.NoError(t, err)
				require.False(t, settled)
				require.Equal(t, store.StateNeedsReview, state(t, key))
				resolutions, err := s.ResolutionsByKey(ctx, key)
				require.NoError(t, err)
				require.Empty(t, resolutions)
			})
		})
	}
}

func outcomes(attempts []store.AttemptRecord) []string {
	out := make([]string, len(attempts))
	for i, a := range attempts {
		out[i] = a.Outcome
	}
	return out
}
