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

// oneConnGrace is how long after its context ends an operation of
// TestOneConnection may take to return before the test calls it hung.
const oneConnGrace = 5 * time.Second

// startBounded starts op, f, under a context that ends after
// oneConnDeadline, and returns what waits for it. The wait fails t, naming
// op, when op has not returned oneConnGrace after its context ended: a
// hang fails the test, not the package's timeout.
func startBounded[T any](t *testing.T, op string, f func(ctx context.Context) (T, error)) (await func() (T, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), oneConnDeadline)
	deadline, _ := ctx.Deadline()
	type result struct {
		value T
		err   error
	}
	done := make(chan result, 1)
	go func() {
		defer cancel()
		value, err := f(ctx)
		done <- result{value, err}
	}()
	return func() (T, error) {
		t.Helper()
		hang := time.NewTimer(time.Until(deadline) + oneConnGrace)
		defer hang.Stop()
		select {
		case r := <-done:
			return r.value, r.err
		case <-hang.C:
			t.Fatalf("%s with one connection hangs: it has not returned %s after its context ended", op, oneConnGrace)
			panic("unreachable")
		}
	}
}

// bounded runs op, f, under oneConnDeadline and returns its result; it
// fails t, naming op, when op hangs or returns an error.
func bounded[T any](t *testing.T, op string, f func(ctx context.Context) (T, error)) T {
	t.Helper()
	value, err := startBounded(t, op, f)()
	requireNoDeadlock(t, op, err)
	return value
}

// requireNoDeadlock fails t, naming op, when op returned an error: with one
// connection, a deadline there means op waited for a second connection.
func requireNoDeadlock(t *testing.T, op string, err error) {
	t.Helper()
	require.NoError(t, err, "%s with one connection: a deadline here means it waited for a second connection", op)
}

// oneConnHarness opens a client over a database handle of exactly one
// connection.
type oneConnHarness[TTx any] struct {
	// open returns a client over a fresh one-connection handle, the
	// handle's pgx pool (for its acquire count), and a function that runs
	// SubmitTx of each call in one transaction of that handle and commits
	// it.
	open func(t *testing.T, config outbox.Config) (*outbox.Client[TTx], *pgxpool.Pool, submitTxFunc)
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

// submitTxFunc submits calls with SubmitTx in one transaction, and commits.
type submitTxFunc func(ctx context.Context, calls ...outbox.Call) ([]outbox.Result, error)

func pgxOneConn() oneConnHarness[pgx.Tx] {
	return oneConnHarness[pgx.Tx]{
		open: func(t *testing.T, config outbox.Config) (*outbox.Client[pgx.Tx], *pgxpool.Pool, submitTxFunc) {
			t.Helper()
			pool := onePool(t)
			client, err := outbox.NewPgx(pool, config)
			require.NoError(t, err)
			return client, pool, func(ctx context.Context, calls ...outbox.Call) ([]outbox.Result, error) {
				results := make([]outbox.Result, len(calls))
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					for i, call := range calls {
						var err error
						if results[i], err = client.SubmitTx(ctx, tx, call); err != nil {
							return err
						}
					}
					return nil
				})
				return results, err
			}
		},
	}
}

func stdOneConn() oneConnHarness[*sql.Tx] {
	return oneConnHarness[*sql.Tx]{
		open: func(t *testing.T, config outbox.Config) (*outbox.Client[*sql.Tx], *pgxpool.Pool, submitTxFunc) {
			t.Helper()
			pool := onePool(t)
			db := stdlib.OpenDBFromPool(pool)
			db.SetMaxOpenConns(1)
			t.Cleanup(func() { _ = db.Close() })
			client, err := outbox.New(db, config)
			require.NoError(t, err)
			return client, pool, func(ctx context.Context, calls ...outbox.Call) ([]outbox.Result, error) {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return nil, err
				}
				defer func() { _ = tx.Rollback() }()
				results := make([]outbox.Result, len(calls))
				for i, call := range calls {
					if results[i], err = client.SubmitTx(ctx, tx, call); err != nil {
						return nil, err
					}
				}
				return results, tx.Commit()
			}
		},
	}
}

// TestOneConnection runs every public operation over a pool of one
// connection (pgxpool MaxConns 1; database/sql SetMaxOpenConns 1): none may
// need a second connection while it holds the first. It runs over direct
// connections only: behind a transaction pooler a listener has a direct
// connection of its own, and never shares the pool.
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
		submitTx submitTxFunc
	}

	// setup opens a client over one connection.
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

	// submit submits call with Submit.
	submit := func(t *testing.T, bundle *testBundle, call outbox.Call) outbox.Result {
		t.Helper()
		return bounded(t, "Submit", func(ctx context.Context) (outbox.Result, error) { return bundle.client.Submit(ctx, call) })
	}

	// runDispatcher runs a dispatcher over the bundle's client until the
	// test ends: over one connection it polls instead of listening, and
	// says so.
	runDispatcher := func(t *testing.T, bundle *testBundle) {
		t.Helper()
		d, err := dispatcher.New(bundle.client, dispatcher.Config{PollInterval: 50 * time.Millisecond})
		require.NoError(t, err)
		runCtx, stop := context.WithCancel(context.WithoutCancel(t.Context()))
		ran := make(chan error, 1)
		go func() { ran <- d.Run(runCtx) }()
		t.Cleanup(func() {
			stop()
			select {
			case err := <-ran:
				require.NoError(t, err)
			case <-time.After(oneConnDeadline):
				t.Errorf("Dispatcher.Run with one connection hangs: it has not returned %s after it was stopped", oneConnDeadline)
			}
		})
		require.Eventually(t, func() bool { return bundle.logs.contains("too small to listen and claim") }, oneConnDeadline, 5*time.Millisecond,
			"the dispatcher never said it polls instead of listening")
	}

	t.Run("Submit", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		res := submit(t, bundle, refundCall("run-submit"))
		require.True(t, res.Created)
	})

	t.Run("SubmitTx", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		res := bounded(t, "SubmitTx", func(ctx context.Context) ([]outbox.Result, error) {
			return bundle.submitTx(ctx, refundCall("run-submit-tx"))
		})
		require.True(t, res[0].Created)
	})

	t.Run("Get", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		res := submit(t, bundle, refundCall("run-get"))
		got := bounded(t, "Get", func(ctx context.Context) (outbox.Result, error) { return bundle.client.Get(ctx, res.Key) })
		require.Equal(t, outbox.StatePending, got.State)
	})

	t.Run("Do", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		res := bounded(t, "Do", func(ctx context.Context) (outbox.Result, error) {
			return bundle.client.Do(ctx, refundCall("run-do"), nil)
		})
		require.Equal(t, outbox.StateSucceeded, res.State)

		// Do of a key submitted earlier claims it with a statement of its own.
		submitted := submit(t, bundle, refundCall("run-do-pending"))
		res = bounded(t, "Do of a pending key", func(ctx context.Context) (outbox.Result, error) {
			return bundle.client.Do(ctx, refundCall("run-do-pending"), nil)
		})
		require.Equal(t, submitted.Key, res.Key)
		require.Equal(t, outbox.StateSucceeded, res.State)
	})

	t.Run("Wait", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		submitted := submit(t, bundle, refundCall("run-wait"))

		// Another process runs the key: a client over the shared pool, with a
		// provider held until Wait is waiting.
		held := &countingProvider{response: json.RawMessage(`{"refund_id":"re_2"}`), hold: make(chan struct{})}
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", held, outbox.IdempotentByKey))
		other, err := outbox.NewPgx(pgoncetest.Pool(t), outbox.Config{Schema: bundle.schema, Registry: registry})
		require.NoError(t, err)
		awaitDo := startBounded(t, "Do over the shared pool", func(ctx context.Context) (outbox.Result, error) {
			return other.Do(ctx, refundCall("run-wait"), nil)
		})
		require.Eventually(t, func() bool { return held.calls.Load() == 1 }, oneConnDeadline, 5*time.Millisecond)

		acquired := bundle.pool.Stat().AcquireCount()
		awaitWait := startBounded(t, "Wait", func(ctx context.Context) (outbox.Result, error) {
			return bundle.client.Wait(ctx, submitted.Key)
		})
		// Wait read the key once, and took the connection again since: to
		// listen, or to read again.
		require.Eventually(t, func() bool { return bundle.pool.Stat().AcquireCount() >= acquired+2 },
			oneConnDeadline, 5*time.Millisecond)
		close(held.hold)
		_, err = awaitDo()
		require.NoError(t, err)

		got, err := awaitWait()
		requireNoDeadlock(t, "Wait", err)
		require.Equal(t, outbox.StateSucceeded, got.State)
		require.JSONEq(t, `{"refund_id":"re_2"}`, string(got.Response))
	})

	t.Run("WaitWhileADispatcherOnThePoolDrainsKeys", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		// Keys submitted in one transaction, and a Wait for each that has
		// read its key and taken the connection again since (to listen, or
		// to read again) before a dispatcher over the same connection
		// starts: the dispatcher claims, calls and records while every
		// Wait runs.
		const keys = 3
		calls := make([]outbox.Call, keys)
		for i := range calls {
			calls[i] = refundCall(fmt.Sprintf("run-wait-dispatch-%d", i))
		}
		submitted := bounded(t, "SubmitTx", func(ctx context.Context) ([]outbox.Result, error) { return bundle.submitTx(ctx, calls...) })
		acquired := bundle.pool.Stat().AcquireCount()
		awaits := make([]func() (outbox.Result, error), keys)
		for i, res := range submitted {
			awaits[i] = startBounded(t, "Wait", func(ctx context.Context) (outbox.Result, error) {
				return bundle.client.Wait(ctx, res.Key)
			})
		}
		require.Eventually(t, func() bool { return bundle.pool.Stat().AcquireCount() >= acquired+2*keys },
			oneConnDeadline, 5*time.Millisecond, "the Waits never took the connection")
		runDispatcher(t, bundle)

		for _, await := range awaits {
			res, err := await()
			requireNoDeadlock(t, "Wait", err)
			require.Equal(t, outbox.StateSucceeded, res.State)
		}
		require.Equal(t, int64(keys), bundle.provider.calls.Load())
	})

	t.Run("Resolve", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		call := outbox.Call{RunID: "run-resolve", Step: 1, Tool: "email", Args: map[string]any{"to": "a@example.com"}}
		res := bounded(t, "Do", func(ctx context.Context) (outbox.Result, error) { return bundle.client.Do(ctx, call, nil) })
		require.Equal(t, outbox.StateNeedsReview, res.State)

		resolved := bounded(t, "Resolve", func(ctx context.Context) (outbox.Result, error) {
			return bundle.client.Resolve(ctx, res.Key, outbox.Resolution{
				Action:   outbox.ResolveSucceeded,
				Response: json.RawMessage(`{"sent":true}`),
				By:       "operator",
				Reason:   "the mail server logged it",
			})
		})
		require.Equal(t, outbox.StateSucceeded, resolved.State)

		// A key not in review: the error path reads the key too.
		_, err := startBounded(t, "Resolve of a key not in review", func(ctx context.Context) (outbox.Result, error) {
			return bundle.client.Resolve(ctx, res.Key, outbox.Resolution{Action: outbox.ResolveRetry, By: "operator", Reason: "again"})
		})()
		require.ErrorIs(t, err, outbox.ErrNotNeedsReview, "Resolve of a key not in review with one connection")
	})

	t.Run("Inspect", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		res := bounded(t, "Do", func(ctx context.Context) (outbox.Result, error) {
			return bundle.client.Do(ctx, refundCall("run-inspect"), nil)
		})
		inspection := bounded(t, "Inspect", func(ctx context.Context) (outbox.Inspection, error) {
			return bundle.client.Inspect(ctx, res.Key)
		})
		require.Equal(t, outbox.StateSucceeded, inspection.State)

		_, err := startBounded(t, "Inspect of an unknown key", func(ctx context.Context) (outbox.Inspection, error) {
			return bundle.client.Inspect(ctx, mustKey(t, refundCall("run-never")))
		})()
		require.ErrorIs(t, err, outbox.ErrNotFound, "Inspect of an unknown key with one connection")
	})

	t.Run("Prune", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		bounded(t, "Do", func(ctx context.Context) (outbox.Result, error) {
			return bundle.client.Do(ctx, refundCall("run-prune"), nil)
		})
		bounded(t, "Prune (dry run)", func(ctx context.Context) (outbox.PruneResult, error) {
			return bundle.client.Prune(ctx, &outbox.PruneOpts{DryRun: true})
		})
		bounded(t, "Prune", func(ctx context.Context) (outbox.PruneResult, error) {
			return bundle.client.Prune(ctx, nil)
		})
	})

	t.Run("Stats", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		submit(t, bundle, refundCall("run-stats"))
		stats := bounded(t, "Stats", func(ctx context.Context) (outbox.Stats, error) { return bundle.client.Stats(ctx) })
		require.Equal(t, int64(1), stats.Pending)
	})

	t.Run("DispatcherRunDrainsKeys", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		runDispatcher(t, bundle)

		var keys []outbox.Key
		for i := range 3 {
			keys = append(keys, submit(t, bundle, refundCall(fmt.Sprintf("run-dispatch-%d", i))).Key)
		}
		for _, key := range keys {
			res := bounded(t, "Wait", func(ctx context.Context) (outbox.Result, error) { return bundle.client.Wait(ctx, key) })
			require.Equal(t, outbox.StateSucceeded, res.State)
		}
	})

	t.Run("ReconcileRunOnce", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		res := submit(t, bundle, refundCall("run-reconcile"))
		// A worker took the key and died: its lease ended an hour ago.
		pgoncetest.AbandonKeys(t, bundle.schema, time.Hour, res.Key)

		r, err := reconcile.New(bundle.client, reconcile.Config{})
		require.NoError(t, err)
		report := bounded(t, "Reconciler.RunOnce", func(ctx context.Context) (reconcile.Report, error) { return r.RunOnce(ctx) })
		require.Equal(t, 1, report.Resolved["refund"][reconcile.OutcomeRequeued])
	})
}
