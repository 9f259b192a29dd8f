package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/reconcile"
)

// oneConnDeadline bounds every call of TestOneConnection: an operation that
// needs a second connection waits for it until then.
const oneConnDeadline = 15 * time.Second

// oneConnHarness opens a client over a database handle of exactly one
// connection.
type oneConnHarness[TTx any] struct {
	// open returns a client over a fresh one-connection handle, the
	// handle's pgx pool (for its acquire count), and a function that runs
	// SubmitTx in a transaction of that handle and commits it.
	open func(t *testing.T, config outbox.Config) (*outbox.Client[TTx], *pgxpool.Pool, func(ctx context.Context, call outbox.Call) (outbox.Result, error))
}

// onePool returns a pgx pool of one connection to the test database, with
// the harness's empty search_path.
func onePool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	config, err := pgxpool.ParseConfig(pgoncetest.DatabaseURL(t))
	require.NoError(t, err)
	config.ConnConfig.RuntimeParams["search_path"] = ""
	config.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(t.Context(), config)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func pgxOneConn() oneConnHarness[pgx.Tx] {
	return oneConnHarness[pgx.Tx]{
		open: func(t *testing.T, config outbox.Config) (*outbox.Client[pgx.Tx], *pgxpool.Pool, func(context.Context, outbox.Call) (outbox.Result, error)) {
			t.Helper()
			pool := onePool(t)
			client, err := outbox.NewPgx(pool, config)
			require.NoError(t, err)
			return client, pool, func(ctx context.Context, call outbox.Call) (outbox.Result, error) {
				var res outbox.Result
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					var err error
					res, err = client.SubmitTx(ctx, tx, call)
					return err
				})
				return res, err
			}
		},
	}
}

func stdOneConn() oneConnHarness[*sql.Tx] {
	return oneConnHarness[*sql.Tx]{
		open: func(t *testing.T, config outbox.Config) (*outbox.Client[*sql.Tx], *pgxpool.Pool, func(context.Context, outbox.Call) (outbox.Result, error)) {
			t.Helper()
			pool := onePool(t)
			db := stdlib.OpenDBFromPool(pool)
			db.SetMaxOpenConns(1)
			t.Cleanup(func() { _ = db.Close() })
			client, err := outbox.New(db, config)
			require.NoError(t, err)
			return client, pool, func(ctx context.Context, call outbox.Call) (outbox.Result, error) {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return outbox.Result{}, err
				}
				defer func() { _ = tx.Rollback() }()
				res, err := client.SubmitTx(ctx, tx, call)
				if err != nil {
					return res, err
				}
				return res, tx.Commit()
			}
		},
	}
}

// TestOneConnection runs every public operation over a pool of one
// connection (pgxpool MaxConns 1; database/sql SetMaxOpenConns 1): none may
// need a second connection while it holds the first.
func TestOneConnection(t *testing.T) {
	t.Parallel()
	t.Run("Pgx", func(t *testing.T) {
		t.Parallel()
		testOneConnection(t, pgxOneConn())
	})
	t.Run("DatabaseSQL", func(t *testing.T) {
		t.Parallel()
		testOneConnection(t, stdOneConn())
	})
}

// logRecorder collects the messages of a logger.
type logRecorder struct {
	mu       sync.Mutex
	messages []string
}

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (r *logRecorder) Handle(_ context.Context, record slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.messages = append(r.messages, record.Message)
	return nil
}

func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *logRecorder) WithGroup(string) slog.Handler      { return r }

func (r *logRecorder) contains(substring string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, message := range r.messages {
		if strings.Contains(message, substring) {
			return true
		}
	}
	return false
}

func testOneConnection[TTx any](t *testing.T, h oneConnHarness[TTx]) {
	t.Helper()

	type testBundle struct {
		client   *outbox.Client[TTx]
		logs     *logRecorder
		pool     *pgxpool.Pool
		provider *countingProvider
		schema   string
		submitTx func(ctx context.Context, call outbox.Call) (outbox.Result, error)
	}

	setup := func(t *testing.T) *testBundle {
		t.Helper()
		schema := pgoncetest.Schema(t)
		provider := &countingProvider{response: json.RawMessage(`{"refund_id":"re_1"}`)}
		uncertain := &countingProvider{err: outbox.Ambiguous(errors.New("timeout after send"))}
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", provider, outbox.IdempotentByKey))
		require.NoError(t, registry.Register("email", uncertain, outbox.AtMostOnce))
		logs := &logRecorder{}
		client, pool, submitTx := h.open(t, outbox.Config{Schema: schema, Registry: registry, Logger: slog.New(logs)})
		return &testBundle{client: client, logs: logs, pool: pool, provider: provider, schema: schema, submitTx: submitTx}
	}

	// within bounds one operation; its failure says what a deadline means.
	within := func(t *testing.T) context.Context {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), oneConnDeadline)
		t.Cleanup(cancel)
		return ctx
	}
	const deadlock = "with one connection: a deadline here means the call waited for a second connection"

	t.Run("Submit", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		res, err := bundle.client.Submit(within(t), refundCall("run-submit"))
		require.NoError(t, err, deadlock)
		require.True(t, res.Created)
	})

	t.Run("SubmitTx", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		res, err := bundle.submitTx(within(t), refundCall("run-submit-tx"))
		require.NoError(t, err, deadlock)
		require.True(t, res.Created)
	})

	t.Run("Get", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		res, err := bundle.client.Submit(within(t), refundCall("run-get"))
		require.NoError(t, err, deadlock)
		got, err := bundle.client.Get(within(t), res.Key)
		require.NoError(t, err, deadlock)
		require.Equal(t, outbox.StatePending, got.State)
	})

	t.Run("Do", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		res, err := bundle.client.Do(within(t), refundCall("run-do"), nil)
		require.NoError(t, err, deadlock)
		require.Equal(t, outbox.StateSucceeded, res.State)

		// Do of a key submitted earlier claims it with a statement of its own.
		submitted, err := bundle.client.Submit(within(t), refundCall("run-do-pending"))
		require.NoError(t, err, deadlock)
		res, err = bundle.client.Do(within(t), refundCall("run-do-pending"), nil)
		require.NoError(t, err, deadlock)
		require.Equal(t, submitted.Key, res.Key)
		require.Equal(t, outbox.StateSucceeded, res.State)
	})

	t.Run("Wait", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		submitted, err := bundle.client.Submit(within(t), refundCall("run-wait"))
		require.NoError(t, err, deadlock)

		// Another process runs the key: a client over the shared pool, with a
		// provider held until Wait is waiting.
		held := &countingProvider{response: json.RawMessage(`{"refund_id":"re_2"}`), hold: make(chan struct{})}
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", held, outbox.IdempotentByKey))
		other, err := outbox.NewPgx(pgoncetest.Pool(t), outbox.Config{Schema: bundle.schema, Registry: registry})
		require.NoError(t, err)
		doErr := make(chan error, 1)
		go func() {
			_, err := other.Do(context.WithoutCancel(t.Context()), refundCall("run-wait"), nil)
			doErr <- err
		}()
		require.Eventually(t, func() bool { return held.calls.Load() == 1 }, oneConnDeadline, 5*time.Millisecond)

		acquired := bundle.pool.Stat().AcquireCount()
		type waitResult struct {
			res outbox.Result
			err error
		}
		waited := make(chan waitResult, 1)
		waitCtx := within(t)
		go func() {
			res, err := bundle.client.Wait(waitCtx, submitted.Key)
			waited <- waitResult{res, err}
		}()
		// Wait read the key once, and took the connection again since: to
		// listen, or to read again.
		require.Eventually(t, func() bool { return bundle.pool.Stat().AcquireCount() >= acquired+2 },
			oneConnDeadline, 5*time.Millisecond)
		close(held.hold)
		require.NoError(t, <-doErr)

		got := <-waited
		require.NoError(t, got.err, deadlock)
		require.Equal(t, outbox.StateSucceeded, got.res.State)
		require.JSONEq(t, `{"refund_id":"re_2"}`, string(got.res.Response))
	})

	t.Run("Resolve", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		call := outbox.Call{RunID: "run-resolve", Step: 1, Tool: "email", Args: map[string]any{"to": "a@example.com"}}
		res, err := bundle.client.Do(within(t), call, nil)
		require.NoError(t, err, deadlock)
		require.Equal(t, outbox.StateNeedsReview, res.State)

		resolved, err := bundle.client.Resolve(within(t), res.Key, outbox.Resolution{
			Action:   outbox.ResolveSucceeded,
			Response: json.RawMessage(`{"sent":true}`),
			By:       "operator",
			Reason:   "the mail server logged it",
		})
		require.NoError(t, err, deadlock)
		require.Equal(t, outbox.StateSucceeded, resolved.State)

		// A key not in review: the error path reads the key too.
		_, err = bundle.client.Resolve(within(t), res.Key, outbox.Resolution{Action: outbox.ResolveRetry, By: "operator", Reason: "again"})
		require.ErrorIs(t, err, outbox.ErrNotNeedsReview, deadlock)
	})

	t.Run("Inspect", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		res, err := bundle.client.Do(within(t), refundCall("run-inspect"), nil)
		require.NoError(t, err, deadlock)
		inspection, err := bundle.client.Inspect(within(t), res.Key)
		require.NoError(t, err, deadlock)
		require.Equal(t, outbox.StateSucceeded, inspection.State)

		_, err = bundle.client.Inspect(within(t), mustKey(t, refundCall("run-never")))
		require.ErrorIs(t, err, outbox.ErrNotFound, deadlock)
	})

	t.Run("Prune", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		_, err := bundle.client.Do(within(t), refundCall("run-prune"), nil)
		require.NoError(t, err, deadlock)
		_, err = bundle.client.Prune(within(t), &outbox.PruneOpts{DryRun: true})
		require.NoError(t, err, deadlock)
		_, err = bundle.client.Prune(within(t), nil)
		require.NoError(t, err, deadlock)
	})

	t.Run("Stats", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		_, err := bundle.client.Submit(within(t), refundCall("run-stats"))
		require.NoError(t, err, deadlock)
		stats, err := bundle.client.Stats(within(t))
		require.NoError(t, err, deadlock)
		require.Equal(t, int64(1), stats.Pending)
	})

	t.Run("DispatcherRunDrainsKeys", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		d, err := dispatcher.New(bundle.client, dispatcher.Config{PollInterval: 50 * time.Millisecond})
		require.NoError(t, err)
		runCtx, stop := context.WithCancel(context.WithoutCancel(t.Context()))
		ran := make(chan error, 1)
		go func() { ran <- d.Run(runCtx) }()
		defer func() {
			stop()
			require.NoError(t, <-ran)
		}()
		// It cannot listen and claim at once on one connection, and says so.
		require.Eventually(t, func() bool { return bundle.logs.contains("too small to listen and claim") }, oneConnDeadline, 5*time.Millisecond,
			"the dispatcher never said it polls instead of listening")

		var keys []outbox.Key
		for i := range 3 {
			res, err := bundle.client.Submit(within(t), refundCall(fmt.Sprintf("run-dispatch-%d", i)))
			require.NoError(t, err, deadlock)
			keys = append(keys, res.Key)
		}
		for _, key := range keys {
			res, err := bundle.client.Wait(within(t), key)
			require.NoError(t, err, deadlock)
			require.Equal(t, outbox.StateSucceeded, res.State)
		}
	})

	t.Run("ReconcileRunOnce", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		res, err := bundle.client.Submit(within(t), refundCall("run-reconcile"))
		require.NoError(t, err, deadlock)
		// A worker took the key and died: its lease ended an hour ago.
		_, err = pgoncetest.Pool(t).Exec(t.Context(), `UPDATE "`+bundle.schema+`".pgonce_key
			SET attempt = 1, lease_until = now() - interval '1 hour', worker = 'dead', first_attempted_at = now() - interval '1 hour'
			WHERE key = $1`, string(res.Key))
		require.NoError(t, err)

		r, err := reconcile.New(bundle.client, reconcile.Config{})
		require.NoError(t, err)
		report, err := r.RunOnce(within(t))
		require.NoError(t, err, deadlock)
		require.Equal(t, 1, report.Resolved["refund"][reconcile.OutcomeRequeued])
	})
}
