package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

// TestIsTransient: the errors a database gives for "ask again" (a
// statement_timeout, a killed connection) are transient on both drivers,
// and an error in the statement, the caller leaving and the client's own
// answers about a key are not.
func TestIsTransient(t *testing.T) {
	t.Parallel()
	ctx := t.Context()

	t.Run("StatementTimeout", func(t *testing.T) {
		t.Parallel()
		conn, err := pgoncetest.Pool(t).Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		_, err = conn.Exec(ctx, `SET statement_timeout = '10ms'`)
		require.NoError(t, err)
		defer conn.Exec(context.Background(), `RESET statement_timeout`) //nolint:errcheck // best effort on a pooled connection
		_, err = conn.Exec(ctx, `SELECT pg_sleep(5)`)
		require.Error(t, err)
		require.True(t, outbox.IsTransient(err), "%v", err)
		require.True(t, outbox.IsTransient(fmt.Errorf("submit: %w", err)), "wrapped: %v", err)
	})

	t.Run("StatementTimeoutDatabaseSQL", func(t *testing.T) {
		t.Parallel()
		db := pgoncetest.DB(t)
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer tx.Rollback() //nolint:errcheck // the statement below aborts it
		_, err = tx.ExecContext(ctx, `SET LOCAL statement_timeout = '10ms'`)
		require.NoError(t, err)
		_, err = tx.ExecContext(ctx, `SELECT pg_sleep(5)`)
		require.Error(t, err)
		require.True(t, outbox.IsTransient(err), "%v", err)
	})

	t.Run("KilledConnection", func(t *testing.T) {
		t.Parallel()
		pool, kill := pgoncetest.KillablePool(t)
		require.NoError(t, pool.Ping(ctx))
		require.NoError(t, kill(ctx))
		_, err := pool.Exec(ctx, `SELECT 1`)
		require.Error(t, err)
		require.True(t, outbox.IsTransient(err), "%v", err)
	})

	t.Run("NotTransient", func(t *testing.T) {
		t.Parallel()
		_, err := pgoncetest.Pool(t).Exec(ctx, `SELECT 1/0`)
		require.Error(t, err)
		require.False(t, outbox.IsTransient(err), "%v", err)
		_, err = pgoncetest.DB(t).ExecContext(ctx, `SELECT * FROM no_such_table_anywhere`)
		require.Error(t, err)
		require.False(t, outbox.IsTransient(err), "%v", err)
		for _, err := range []error{nil, context.Canceled, outbox.ErrNotFound, outbox.ErrKeyConflict, outbox.ErrInvalidParams, errors.New("other")} {
			require.False(t, outbox.IsTransient(err), "%v", err)
		}
		require.True(t, outbox.IsTransient(outbox.ErrTimeout))
		require.True(t, outbox.IsTransient(outbox.ErrSerialization))
	})
}
