package store_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/store"
)

func TestIsTransient(t *testing.T) {
	t.Parallel()

	// failure runs statements in a transaction of their own, rolled back,
	// and returns the error of the last.
	failure := func(t *testing.T, statements ...string) error {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		tx, err := pgoncetest.Pool(t).Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		for _, statement := range statements {
			if _, err = tx.Exec(ctx, statement); err != nil {
				return store.InterpretError(err)
			}
		}
		return nil
	}

	for _, tt := range []struct {
		name       string
		statements []string
		transient  bool
		data       bool
	}{
		{"StatementTimeout", []string{"SET LOCAL statement_timeout = '10ms'", "SELECT pg_sleep(5)"}, true, false},
		{"LockTimeout", []string{
			"SET LOCAL lock_timeout = '10ms'",
			// Another session holds this lock (see heldLock).
			"SELECT pg_advisory_xact_lock(727274)",
		}, true, false},
		{"InvalidText", []string{"SELECT convert_from('\\xff'::bytea, 'UTF8')"}, false, true},
		{"OutOfRange", []string{"SELECT 2147483647::integer + 1"}, false, true},
		{"MissingTable", []string{"SELECT * FROM no_such_table_here"}, false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if tt.name == "LockTimeout" {
				heldLock(t, 727274)
			}
			err := failure(t, tt.statements...)
			require.Error(t, err)
			require.Equal(t, tt.transient, store.IsTransient(err), "IsTransient(%v)", err)
			require.Equal(t, tt.data, store.IsDataError(err), "IsDataError(%v)", err)
		})
	}

	// database/sql's words for a lost connection: a statement that found
	// its connection dead (even after database/sql's own retries) and one
	// on a connection handed back after it broke.
	for _, tt := range []struct {
		name string
		err  error
	}{
		{"BadConn", driver.ErrBadConn},
		{"BadConnWrapped", fmt.Errorf("get key: %w", driver.ErrBadConn)},
		{"ConnDone", sql.ErrConnDone},
		{"ConnDoneWrapped", fmt.Errorf("record outcomes: %w", sql.ErrConnDone)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.True(t, store.IsTransient(tt.err), "IsTransient(%v)", tt.err)
			require.True(t, store.IsTransient(store.InterpretError(tt.err)), "IsTransient(InterpretError(%v))", tt.err)
			require.False(t, store.IsDataError(tt.err))
		})
	}

	t.Run("DatabaseSQLOnAKilledConnection", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		db := stdlib.OpenDBFromPool(pgoncetest.Pool(t))
		t.Cleanup(func() { _ = db.Close() })
		conn, err := db.Conn(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		var pid int
		require.NoError(t, conn.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid))
		_, err = pgoncetest.Pool(t).Exec(ctx, "SELECT pg_terminate_backend($1)", pid)
		require.NoError(t, err)
		// The first statement meets the dead connection, the next ones
		// database/sql's report of it.
		for range 3 {
			_, err = conn.ExecContext(ctx, "SELECT 1")
			require.Error(t, err)
			require.True(t, store.IsTransient(store.InterpretError(err)), "IsTransient(%v)", err)
		}
	})

	t.Run("CallerCancelledIsNotTransient", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := pgoncetest.Pool(t).Exec(ctx, "SELECT 1")
		require.Error(t, err)
		require.False(t, store.IsTransient(err))
	})
}

// heldLock holds advisory lock id in a session of its own until t ends.
func heldLock(t *testing.T, id int64) {
	t.Helper()
	conn, err := pgoncetest.Pool(t).Acquire(t.Context())
	require.NoError(t, err)
	_, err = conn.Exec(t.Context(), "SELECT pg_advisory_lock($1)", id)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = conn.Exec(context.Background(), "SELECT pg_advisory_unlock($1)", id)
		conn.Release()
	})
}
