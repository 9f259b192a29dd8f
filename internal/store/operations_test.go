package store_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/store"
)

// drivers returns a store over a fresh schema for each driver, with the
// executor of a caller's transaction begun by begin.
func drivers(t *testing.T) map[string]func(t *testing.T) (*store.Store, func(t *testing.T) store.Executor) {
	t.Helper()
	return map[string]func(t *testing.T) (*store.Store, func(t *testing.T) store.Executor){
		"Pgx": func(t *testing.T) (*store.Store, func(t *testing.T) store.Executor) {
			t.Helper()
			driver, err := store.NewPgxDriver(pgoncetest.Pool(t), pgoncetest.Schema(t))
			require.NoError(t, err)
			return driver.Store(), func(t *testing.T) store.Executor {
				t.Helper()
				tx, err := pgoncetest.Pool(t).Begin(t.Context())
				require.NoError(t, err)
				t.Cleanup(func() { _ = tx.Rollback(t.Context()) })
				return driver.UnwrapExecutor(tx)
			}
		},
		"DatabaseSQL": func(t *testing.T) (*store.Store, func(t *testing.T) store.Executor) {
			t.Helper()
			driver, err := store.NewStdDriver(pgoncetest.DB(t), pgoncetest.Schema(t))
			require.NoError(t, err)
			return driver.Store(), func(t *testing.T) store.Executor {
				t.Helper()
				tx, err := pgoncetest.DB(t).BeginTx(t.Context(), nil)
				require.NoError(t, err)
				t.Cleanup(func() { _ = tx.Rollback() })
				return driver.UnwrapExecutor(tx)
			}
		},
	}
}

func newKey(n int) *store.NewKey {
	return &store.NewKey{
		Key: fmt.Sprintf("k1_%064d", n), Scope: fmt.Sprintf("%064x", n), RunID: "run", Step: int64(n),
		Tool: "refund", Args: []byte(`{"n":1}`),
	}
}

// TestOperations runs the store's named operations through both drivers:
// the same life of a key, each statement in the store's schema.
func TestOperations(t *testing.T) {
	t.Parallel()

	for name, open := range drivers(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			s, begin := open(t)
			exec := s.Executor()

			t.Run("InsertAndGet", func(t *testing.T) {
				t.Parallel()
				key := newKey(1)
				inserted, err := exec.KeyInsert(ctx, key)
				require.NoError(t, err)
				require.Zero(t, inserted.Attempt)
				require.Nil(t, inserted.LeaseUntil, "pending")

				_, err = exec.KeyInsert(ctx, key)
				require.ErrorIs(t, err, store.ErrNoRows, "the key exists")
				other := newKey(2)
				other.Scope = key.Scope
				_, err = exec.KeyInsert(ctx, other)
				require.ErrorIs(t, err, store.ErrNoRows, "the scope exists")
				row, err := exec.KeyGetByKeyOrScope(ctx, other.Key, other.Scope, nil)
				require.NoError(t, err)
				require.Equal(t, key.Key, row.Key, "found by its scope")

				row, err = exec.KeyGet(ctx, key.Key, nil)
				require.NoError(t, err)
				require.Equal(t, string(store.StateOpen), row.State)
				require.Equal(t, "refund", row.Tool)
				args, err := s.Args(ctx, key.Key)
				require.NoError(t, err)
				require.JSONEq(t, `{"n":1}`, string(args))
				_, err = exec.KeyGet(ctx, newKey(99).Key, nil)
				require.ErrorIs(t, err, store.ErrNoRows)
			})

			t.Run("InsertInTheCallersTransaction", func(t *testing.T) {
				t.Parallel()
				key := newKey(3)
				_, err := begin(t).KeyInsert(ctx, key)
				require.NoError(t, err)
				_, err = exec.KeyGet(ctx, key.Key, nil)
				require.ErrorIs(t, err, store.ErrNoRows, "not visible before the caller commits")
			})

			t.Run("ClaimFinishAndCount", func(t *testing.T) {
				t.Parallel()
				key := newKey(4)
				_, err := exec.KeyInsert(ctx, key)
				require.NoError(t, err)
				claimed, err := s.ClaimKey(ctx, &store.ClaimKeyParams{Key: key.Key, Lease: time.Minute, Worker: "w"})
				require.NoError(t, err)
				require.Equal(t, 1, claimed.Attempt)
				_, err = s.ClaimKey(ctx, &store.ClaimKeyParams{Key: key.Key, Lease: time.Minute, Worker: "w"})
				require.ErrorIs(t, err, store.ErrNoRows, "in flight already")
				entry, err := s.QueueEntry(ctx, key.Key)
				require.NoError(t, err)
				require.Equal(t, "w", entry.Worker)

				written, err := s.Finish(ctx, &store.FinishParams{
					Outcomes: []store.Outcome{
						{Key: key.Key, Scope: key.Scope, Attempt: 2, State: store.StateSucceeded, Response: []byte(`{}`), Retention: time.Hour},
					},
					TombstoneRetention: time.Hour,
				})
				require.NoError(t, err)
				require.Empty(t, written, "fenced out: attempt 2 does not hold the key")
				written, err = s.Finish(ctx, &store.FinishParams{
					Outcomes: []store.Outcome{
						{Key: key.Key, Scope: key.Scope, Attempt: 1, State: store.StateSucceeded, Response: []byte(`{"ok":true}`), Retention: time.Hour},
					},
					TombstoneRetention: time.Hour,
				})
				require.NoError(t, err)
				require.Equal(t, []string{key.Key}, written)
				recorded, err := s.RecordedAttempts(ctx, []store.AttemptRef{{Key: key.Key, Scope: key.Scope, Attempt: 1}})
				require.NoError(t, err)
				require.Equal(t, []string{key.Key}, recorded)
				_, err = s.QueueEntry(ctx, key.Key)
				require.ErrorIs(t, err, store.ErrNoRows, "off the queue")

				row, err := exec.KeyGet(ctx, key.Key, nil)
				require.NoError(t, err)
				require.Equal(t, string(store.StateSucceeded), row.State)
				require.JSONEq(t, `{"ok":true}`, string(row.Response))

				counts, err := s.CountByToolAndState(ctx)
				require.NoError(t, err)
				require.Contains(t, counts, &store.StateCount{Tool: "refund", State: string(store.StateSucceeded), Keys: 1})
			})
		})
	}
}
