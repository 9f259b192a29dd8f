package outbox_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

func TestSubmitTxTransactionErrors(t *testing.T) {
	t.Parallel()
	eachHarness(t, testSubmitTxTransactionErrors[pgx.Tx], testSubmitTxTransactionErrors[*sql.Tx])
}

func testSubmitTxTransactionErrors[TTx any](t *testing.T, h driverHarness[TTx]) {
	t.Helper()

	setup := func(t *testing.T) (*outbox.Client[TTx], string) {
		t.Helper()
		config := refundConfig(t)
		return h.newClient(t, config), config.Schema
	}

	// blocked starts a transaction that claims call and stays open, so that
	// a second claim of call waits for it.
	blocked := func(t *testing.T, client *outbox.Client[TTx], call outbox.Call) {
		t.Helper()
		holder := h.begin(t, nil)
		_, err := client.SubmitTx(t.Context(), holder, call)
		require.NoError(t, err)
		t.Cleanup(func() { _ = h.rollback(holder) })
	}

	for _, tt := range []struct {
		name    string
		setting string
	}{
		{"LockTimeout", "SET LOCAL lock_timeout = '100ms'"},
		{"StatementTimeout", "SET LOCAL statement_timeout = '100ms'"},
	} {
		t.Run(tt.name+"IsErrTimeout", func(t *testing.T) {
			t.Parallel()
			client, _ := setup(t)
			call := refundCall("run-timeout")
			blocked(t, client, call)

			tx := h.begin(t, nil)
			require.NoError(t, h.exec(tx, tt.setting))
			_, err := client.SubmitTx(t.Context(), tx, call)
			require.ErrorIs(t, err, outbox.ErrTimeout)
			require.NotErrorIs(t, err, context.DeadlineExceeded)
			require.NoError(t, h.rollback(tx))
		})
	}

	t.Run("CallerDeadlineIsNotErrTimeout", func(t *testing.T) {
		t.Parallel()
		client, _ := setup(t)
		call := refundCall("run-deadline")
		blocked(t, client, call)

		tx := h.begin(t, nil)
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()
		_, err := client.SubmitTx(ctx, tx, call)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.NotErrorIs(t, err, outbox.ErrTimeout)
	})

	t.Run("AbortedTransactionIsErrTxAborted", func(t *testing.T) {
		t.Parallel()
		client, schema := setup(t)
		before := tableHashes(t, schema)

		tx := h.begin(t, nil)
		require.Error(t, h.exec(tx, "SELECT 1/0"))
		_, err := client.SubmitTx(t.Context(), tx, refundCall("run-aborted"))
		require.ErrorIs(t, err, outbox.ErrTxAborted)
		require.NoError(t, h.rollback(tx))
		require.Equal(t, before, tableHashes(t, schema))
	})

	for _, tt := range []struct {
		name string
		end  func(tx TTx) error
	}{
		{"Committed", h.commit},
		{"RolledBack", h.rollback},
	} {
		t.Run(tt.name+"TransactionIsErrTxDone", func(t *testing.T) {
			t.Parallel()
			client, schema := setup(t)
			before := tableHashes(t, schema)

			tx := h.begin(t, nil)
			require.NoError(t, tt.end(tx))
			_, err := client.SubmitTx(t.Context(), tx, refundCall("run-done"))
			require.ErrorIs(t, err, outbox.ErrTxDone)
			require.Equal(t, before, tableHashes(t, schema))
		})
	}
}

// A pool whose connections cancel a statement with a cancel request when
// its context ends (rather than closing the socket): PostgreSQL answers
// 57014, which is the caller's deadline, not ErrTimeout.
func TestSubmitTxCancelRequestIsCallerDeadline(t *testing.T) {
	t.Parallel()
	clientConfig := refundConfig(t)
	config, err := pgxpool.ParseConfig(pgoncetest.DatabaseURL(t))
	require.NoError(t, err)
	config.ConnConfig.RuntimeParams["search_path"] = ""
	config.ConnConfig.BuildContextWatcherHandler = func(conn *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: conn, CancelRequestDelay: 0, DeadlineDelay: 10 * time.Second}
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), config)
	require.NoError(t, err)
	defer pool.Close()
	client, err := outbox.NewPgx(pool, clientConfig)
	require.NoError(t, err)

	call := refundCall("run-cancel-request")
	holder, err := pool.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(context.WithoutCancel(t.Context())) }()
	_, err = client.SubmitTx(t.Context(), holder, call)
	require.NoError(t, err)

	tx, err := pool.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(t.Context())) }()
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, err = client.SubmitTx(ctx, tx, call)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NotErrorIs(t, err, outbox.ErrTimeout)
}
