package outbox_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
)

// taggedPool returns a pool of its own whose connections carry a unique
// application_name, so that a test can find and kill exactly its backends.
func taggedPool(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	config, err := pgxpool.ParseConfig(pgoncetest.DatabaseURL(t))
	require.NoError(t, err)
	var suffix [6]byte
	_, _ = rand.Read(suffix[:])
	tag := "pgonce_wait_" + hex.EncodeToString(suffix[:])
	config.ConnConfig.RuntimeParams["application_name"] = tag
	config.ConnConfig.RuntimeParams["search_path"] = ""
	config.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(t.Context(), config)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, tag
}

// killBackends terminates the backends tagged tag every few milliseconds
// until ctx is done, and counts those it terminated.
func killBackends(ctx context.Context, t *testing.T, tag string, killed *atomic.Int64) <-chan struct{} {
	t.Helper()
	done := make(chan struct{})
	pool := pgoncetest.Pool(t)
	go func() {
		defer close(done)
		ticker := time.NewTicker(5 * time.Millisecond)
		defer ticker.Stop()
		for {
			var n int64
			err := pool.QueryRow(ctx, `
				SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
				FROM pg_stat_activity WHERE application_name = $1`, tag).Scan(&n)
			if err == nil {
				killed.Add(n)
			}
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
			}
		}
	}()
	return done
}

// TestWaitSurvivesKilledConnections runs directly only: it kills the
// backends of a pool of its own, found by their application_name, which
// the server connections behind a transaction pooler do not carry.
func TestWaitSurvivesKilledConnections(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		name      string
		newClient func(t *testing.T, pool *pgxpool.Pool, config outbox.Config) func(ctx context.Context, key outbox.Key) (outbox.Result, error)
	}{
		{"Pgx", func(t *testing.T, pool *pgxpool.Pool, config outbox.Config) func(context.Context, outbox.Key) (outbox.Result, error) {
			t.Helper()
			client, err := outbox.NewPgx(pool, config)
			require.NoError(t, err)
			return client.Wait
		}},
		{"DatabaseSQL", func(t *testing.T, pool *pgxpool.Pool, config outbox.Config) func(context.Context, outbox.Key) (outbox.Result, error) {
			t.Helper()
			db := stdlib.OpenDBFromPool(pool)
			t.Cleanup(func() { _ = db.Close() })
			client, err := outbox.New(db, config)
			require.NoError(t, err)
			return client.Wait
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			schema := pgoncetest.Schema(t)
			registry := outbox.NewRegistry()
			require.NoError(t, registry.Register("refund", &countingProvider{response: json.RawMessage(`{"refund_id":"re_1"}`)}, outbox.IdempotentByKey))
			config := outbox.Config{Schema: schema, Registry: registry}
			// The completing client works on the shared pool, which is
			// never killed.
			other, err := outbox.NewPgx(pgoncetest.Pool(t), config)
			require.NoError(t, err)
			res, err := other.Submit(t.Context(), refundCall("run-killed"))
			require.NoError(t, err)

			pool, tag := taggedPool(t)
			logger, logs := pgoncetest.CaptureLogs()
			waitConfig := config
			waitConfig.Logger = logger
			wait := tt.newClient(t, pool, waitConfig)

			killCtx, stopKilling := context.WithCancel(context.WithoutCancel(t.Context()))
			defer stopKilling()
			var killed atomic.Int64
			killerDone := killBackends(killCtx, t, tag, &killed)

			type waited struct {
				res outbox.Result
				err error
			}
			result := make(chan waited, 1)
			waitCtx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			go func() {
				res, err := wait(waitCtx, res.Key)
				result <- waited{res, err}
			}()

			// The wait loses several connections, and reads through
			// some that died under it, before the key completes: it must
			// keep waiting through every one.
			retried := func(r pgoncetest.LogRecord) bool {
				return r.Message == "pgonce: wait could not read its key; retrying"
			}
			for killed.Load() < 8 || len(logs.Matching(retried)) == 0 {
				select {
				case got := <-result:
					t.Fatalf("wait returned before the key completed, after %d killed connections: %+v, %v", killed.Load(), got.res, got.err)
				case <-waitCtx.Done():
					t.Fatalf("only %d connections killed, %d failed reads", killed.Load(), len(logs.Matching(retried)))
				case <-time.After(time.Millisecond):
				}
			}
			// The killing stops once the key completes: a killer faster
			// than a connection can be made would leave no read a chance,
			// and the wait nothing to see.
			done, err := other.Do(t.Context(), refundCall("run-killed"), nil)
			require.NoError(t, err)
			require.Equal(t, outbox.StateSucceeded, done.State)
			stopKilling()
			<-killerDone

			got := <-result
			require.NoError(t, got.err)
			require.Equal(t, outbox.StateSucceeded, got.res.State)
			require.Equal(t, []byte(done.Response), []byte(got.res.Response))
			require.GreaterOrEqual(t, killed.Load(), int64(8))
		})
	}
}

// TestWaitSurvivesAHalfOpenConnection runs directly only: its waiting
// client's pool is one of its own, behind a proxy that makes its
// connections half-open.
func TestWaitSurvivesAHalfOpenConnection(t *testing.T) {
	t.Parallel()
	schema := pgoncetest.Schema(t)
	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("refund", &countingProvider{response: json.RawMessage(`{"refund_id":"re_1"}`)}, outbox.IdempotentByKey))
	config := outbox.Config{Schema: schema, Registry: registry}
	other, err := outbox.NewPgx(pgoncetest.Pool(t), config)
	require.NoError(t, err)
	res, err := other.Submit(t.Context(), refundCall("run-half-open"))
	require.NoError(t, err)

	// The waiting client's one idle connection goes half-open: its server
	// vanished without closing it. Notifications are off, so the wait
	// sees the result only by reading.
	proxy, pool := pgoncetest.NewBlackHoleProxy(t, 4)
	require.NoError(t, pool.Ping(t.Context()))
	proxy.BlackHole()
	config.NotifyDisabled = true
	config.StatementTimeout = 300 * time.Millisecond
	waiter, err := outbox.NewPgx(pool, config)
	require.NoError(t, err)

	type waited struct {
		res outbox.Result
		err error
	}
	result := make(chan waited, 1)
	waitCtx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	go func() {
		res, err := waiter.Wait(waitCtx, res.Key)
		result <- waited{res, err}
	}()

	done, err := other.Do(t.Context(), refundCall("run-half-open"), nil)
	require.NoError(t, err)
	got := <-result
	require.NoError(t, got.err)
	require.Equal(t, outbox.StateSucceeded, got.res.State)
	require.Equal(t, []byte(done.Response), []byte(got.res.Response))
}

func TestWaitReturnsDefinitiveErrorsAtOnce(t *testing.T) {
	t.Parallel()

	t.Run("OverEachDriver", func(t *testing.T) {
		t.Parallel()
		eachHarness(t, testWaitReturnsDefinitiveErrorsAtOnce[pgx.Tx], testWaitReturnsDefinitiveErrorsAtOnce[*sql.Tx])
	})

	t.Run("ServerUnreachableUntilCtxDone", func(t *testing.T) {
		t.Parallel()
		// Nothing listens on port 1: every read fails to connect, which
		// may pass, so the wait retries until its ctx ends and says what
		// it met.
		config, err := pgxpool.ParseConfig("postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=1")
		require.NoError(t, err)
		pool, err := pgxpool.NewWithConfig(t.Context(), config)
		require.NoError(t, err)
		defer pool.Close()
		client, err := outbox.NewPgx(pool, outbox.Config{NotifyDisabled: true})
		require.NoError(t, err)

		// The deadline passes once a read has failed, however long that
		// takes.
		key := mustKey(t, refundCall("run-1"))
		got, err := client.Wait(newReadDeadlines(client).after(t.Context(), key), key)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Contains(t, err.Error(), "last read failed")
		require.Equal(t, outbox.Result{}, got)
	})
}

func testWaitReturnsDefinitiveErrorsAtOnce[TTx any](t *testing.T, h driverHarness[TTx]) {
	t.Helper()

	t.Run("MissingTable", func(t *testing.T) {
		t.Parallel()
		// A schema that was never migrated: retrying cannot help.
		client := h.newClient(t, outbox.Config{Schema: pgoncetest.NewSchemaName(t)})
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		_, err := client.Wait(ctx, mustKey(t, refundCall("run-1")))
		require.Error(t, err)
		require.NoError(t, ctx.Err(), "Wait retried a definitive error until ctx was done")
	})

	t.Run("Expired", func(t *testing.T) {
		t.Parallel()
		config := refundConfig(t)
		schema := config.Schema
		client := h.newClient(t, config)
		done, err := client.Do(t.Context(), refundCall("run-old"), nil)
		require.NoError(t, err)
		_, err = pgoncetest.Pool(t).Exec(t.Context(), pgoncetest.TombstoneStatement(schema), pgoncetest.StoredKey(t, string(done.Key)), nil)
		require.NoError(t, err)

		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		got, err := client.Wait(ctx, done.Key)
		require.ErrorIs(t, err, outbox.ErrExpired)
		require.Equal(t, outbox.StateExpired, got.State)
		require.NoError(t, ctx.Err())
	})
}

// TestWaitThroughATransactionPoolerPolls waits through the shared PgBouncer
// in transaction pooling mode with no ListenConnectFunc: the client never
// listens through the pooler, which would hear nothing, and its waits read
// their keys again until the result is there.
func TestWaitThroughATransactionPoolerPolls(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name      string
		newClient func(t *testing.T, config outbox.Config) func(ctx context.Context, key outbox.Key) (outbox.Result, error)
	}{
		{drivertest.NamePgxPgBouncer, func(t *testing.T, config outbox.Config) func(context.Context, outbox.Key) (outbox.Result, error) {
			t.Helper()
			client, err := outbox.NewPgx(pgoncetest.PooledPool(t), config)
			require.NoError(t, err)
			return client.Wait
		}},
		{drivertest.NameDatabaseSQLPgBouncer, func(t *testing.T, config outbox.Config) func(context.Context, outbox.Key) (outbox.Result, error) {
			t.Helper()
			client, err := outbox.New(pgoncetest.PooledDB(t), config)
			require.NoError(t, err)
			return client.Wait
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			config := refundConfig(t)
			other, err := outbox.NewPgx(pgoncetest.Pool(t), config)
			require.NoError(t, err)
			res, err := other.Submit(t.Context(), refundCall("run-pooled"))
			require.NoError(t, err)

			logger, logs := pgoncetest.CaptureLogs()
			config.Logger = logger
			config.Pooling = outbox.PoolingTransaction
			wait := tt.newClient(t, config)

			type waited struct {
				res outbox.Result
				err error
			}
			result := make(chan waited, 1)
			waitCtx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			go func() {
				res, err := wait(waitCtx, res.Key)
				result <- waited{res, err}
			}()
			logs.Await(t, func(r pgoncetest.LogRecord) bool {
				return r.Message == "pgonce: behind a transaction pooler without ListenConnectFunc; waits poll"
			})

			done, err := other.Do(t.Context(), refundCall("run-pooled"), nil)
			require.NoError(t, err)
			got := <-result
			require.NoError(t, got.err)
			require.Equal(t, outbox.StateSucceeded, got.res.State)
			require.Equal(t, []byte(done.Response), []byte(got.res.Response))
		})
	}
}

// TestWaitBeforeTheSubmitCommits: a wait for a key whose submit has not
// committed finds nothing, and says that the likeliest cause is waiting
// before the commit.
func TestWaitBeforeTheSubmitCommits(t *testing.T) {
	t.Parallel()
	eachHarness(t, testWaitBeforeTheSubmitCommits[pgx.Tx], testWaitBeforeTheSubmitCommits[*sql.Tx])
}

func testWaitBeforeTheSubmitCommits[TTx any](t *testing.T, h driverHarness[TTx]) {
	t.Helper()
	schema := pgoncetest.Schema(t)
	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("refund", &countingProvider{response: json.RawMessage(`{}`)}, outbox.IdempotentByKey))
	client := h.newClient(t, outbox.Config{Schema: schema, Registry: registry})

	tx := h.begin(t, nil)
	res, err := client.SubmitTx(t.Context(), tx, refundCall("run-uncommitted"))
	require.NoError(t, err)
	require.True(t, res.Created)

	_, err = client.Wait(t.Context(), res.Key)
	require.ErrorIs(t, err, outbox.ErrNotFound)
	require.ErrorContains(t, err, "has not committed yet")
	_, err = client.WaitResult(t.Context(), res)
	require.ErrorIs(t, err, outbox.ErrNotFound)
	require.ErrorContains(t, err, "wait after the commit")

	require.NoError(t, h.commit(tx))
	got, err := client.Get(t.Context(), res.Key)
	require.NoError(t, err)
	require.Equal(t, outbox.StatePending, got.State)
}

// TestWaitForAKeyAFailoverLost: a key whose submit committed and that the
// database no longer holds, as after a failover to an asynchronous standby
// that never received the commit, answers ErrNotFound, and the error names
// what can have happened besides waiting too early: a rollback, or such a
// failover.
func TestWaitForAKeyAFailoverLost(t *testing.T) {
	t.Parallel()
	eachHarness(t, testWaitForAKeyAFailoverLost[pgx.Tx], testWaitForAKeyAFailoverLost[*sql.Tx])
}

func testWaitForAKeyAFailoverLost[TTx any](t *testing.T, h driverHarness[TTx]) {
	t.Helper()
	config := refundConfig(t)
	client := h.newClient(t, config)
	res, err := client.Submit(t.Context(), refundCall("run-lost"))
	require.NoError(t, err)
	require.True(t, res.Created)

	// The promoted standby never received the row.
	tag, err := pgoncetest.Pool(t).Exec(t.Context(),
		`DELETE FROM `+pgx.Identifier{config.Schema}.Sanitize()+`.pgonce_key WHERE key = $1`,
		pgoncetest.StoredKey(t, string(res.Key)))
	require.NoError(t, err)
	require.Equal(t, int64(1), tag.RowsAffected())

	for name, wait := range map[string]func() error{
		"Wait": func() error {
			_, err := client.Wait(t.Context(), res.Key)
			return err
		},
		"WaitResult": func() error {
			_, err := client.WaitResult(t.Context(), res)
			return err
		},
	} {
		err := wait()
		require.ErrorIs(t, err, outbox.ErrNotFound, name)
		require.ErrorContains(t, err, "rolled back", name)
		require.ErrorContains(t, err, "failed over to a standby that never received the commit", name)
	}
}

// readDeadlines gives waits deadlines that pass on a condition, not a
// clock: a context from [readDeadlines.after] expires, with
// context.DeadlineExceeded, once a wait of its client has read its key and
// found it still in progress (it arms its timer to read again). So a test
// that expects a wait to end at its deadline with the last state it read
// sees that state however slow the machine, where a deadline of a few
// hundred milliseconds may pass before the first read returns.
type readDeadlines struct {
	mu    sync.Mutex
	byKey map[outbox.Key][]*expiringContext
}

// newReadDeadlines installs readDeadlines on client; call it before the
// client's first wait.
func newReadDeadlines[TTx any](client *outbox.Client[TTx]) *readDeadlines {
	rd := &readDeadlines{byKey: map[outbox.Key][]*expiringContext{}}
	outbox.SetWaitPolledFunc(client, func(key outbox.Key, _ time.Duration) {
		rd.mu.Lock()
		expiring := rd.byKey[key]
		delete(rd.byKey, key)
		rd.mu.Unlock()
		for _, ctx := range expiring {
			ctx.expire()
		}
	})
	return rd
}

// after returns a context, below parent, whose deadline passes once a wait
// has read key and found it in progress.
func (rd *readDeadlines) after(parent context.Context, key outbox.Key) context.Context {
	ctx := &expiringContext{Context: parent, done: make(chan struct{})}
	context.AfterFunc(parent, ctx.expire)
	rd.mu.Lock()
	rd.byKey[key] = append(rd.byKey[key], ctx)
	rd.mu.Unlock()
	return ctx
}

// expiringContext is a context whose deadline passes when expire is called.
type expiringContext struct {
	context.Context
	done chan struct{}
	once sync.Once
}

func (c *expiringContext) expire() { c.once.Do(func() { close(c.done) }) }

func (c *expiringContext) Done() <-chan struct{} { return c.done }

func (c *expiringContext) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}
