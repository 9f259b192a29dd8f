package faults_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/faults"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/reconcile"
)

// pooledPool returns a pool over url (through a PgBouncer) that the test
// closes when it ends.
func pooledPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := faults.NewPool(t.Context(), url, "pgbouncer_"+t.Name())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// echoRegistry registers "echo", whose provider answers with the key it
// was called with, and counts calls per key in calls.
func echoRegistry(t *testing.T, calls *sync.Map) *outbox.Registry {
	t.Helper()
	registry := outbox.NewRegistry()
	echo := outbox.ProviderFunc(func(_ context.Context, req outbox.Request) (json.RawMessage, error) {
		n, _ := calls.LoadOrStore(req.Key, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		return json.RawMessage(fmt.Sprintf(`{"key":%q}`, req.Key)), nil
	})
	require.NoError(t, registry.Register("echo", echo, outbox.IdempotentByKey))
	return registry
}

// TestPgBouncerEssentials runs the client, Do, Wait, the dispatcher and the
// reconciler through a PgBouncer in transaction pooling mode, on both
// drivers.
func TestPgBouncerEssentials(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testPgBouncerEssentials, testPgBouncerEssentials)
}

func testPgBouncerEssentials[TTx any](t *testing.T, d drivertest.Driver[TTx]) {
	bouncer := pgoncetest.NewPgBouncer(t, "127.0.0.1", 5432, 4)
	pool := pooledPool(t, bouncer.URL())
	schema := pgoncetest.Schema(t)
	var calls sync.Map
	directURL := pgoncetest.DatabaseURL(t)
	config := outbox.Config{
		Schema: schema, Registry: echoRegistry(t, &calls), CallTimeout: time.Second, Lease: 2 * time.Second,
		Pooling: outbox.PoolingTransaction,
		// Listeners connect past the pooler.
		ListenConnectFunc: func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, directURL) },
	}
	client := d.ClientOver(t, pool, config)
	ctx := t.Context()

	// Submit, replay, Get.
	var keys []outbox.Key
	for step := range int64(20) {
		res, err := client.Submit(ctx, outbox.Call{RunID: "pgb", Step: step, Tool: "echo", Args: map[string]any{"n": step}})
		require.NoError(t, err)
		require.True(t, res.Created)
		again, err := client.Submit(ctx, outbox.Call{RunID: "pgb", Step: step, Tool: "echo", Args: map[string]any{"n": step}})
		require.NoError(t, err)
		require.False(t, again.Created)
		require.Equal(t, res.Key, again.Key)
		keys = append(keys, res.Key)
	}
	_, err := client.Submit(ctx, outbox.Call{RunID: "pgb", Step: 0, Tool: "echo", Args: map[string]any{"n": 99}})
	require.ErrorIs(t, err, outbox.ErrKeyConflict)

	// Do, inline.
	res, err := client.Do(ctx, outbox.Call{RunID: "pgb-do", Step: 1, Tool: "echo", Args: map[string]any{}}, nil)
	require.NoError(t, err)
	require.Equal(t, outbox.StateSucceeded, res.State)

	// A dispatcher drains what was submitted; Wait sees each result. It
	// polls once a minute, so only notifications heard on the direct
	// listening connection bring it the keys submitted while it runs in
	// time.
	disp, err := dispatcher.New(client, dispatcher.Config{PollInterval: time.Minute})
	require.NoError(t, err)
	stop := background(t, "Dispatcher.Run", func(ctx context.Context) { _ = disp.Run(ctx) })
	for step := range int64(20) {
		res, err := client.Submit(ctx, outbox.Call{RunID: "pgb-running", Step: step, Tool: "echo", Args: map[string]any{}})
		require.NoError(t, err)
		keys = append(keys, res.Key)
	}
	for _, key := range keys {
		waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		res, err := client.Wait(waitCtx, key)
		cancel()
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, res.State)
		require.JSONEq(t, fmt.Sprintf(`{"key":%q}`, key), string(res.Response))
	}
	// The dispatcher is idle now: a new key reaches it only by a
	// notification, long before its next poll.
	late, err := client.Submit(ctx, outbox.Call{RunID: "pgb-late", Step: 1, Tool: "echo", Args: map[string]any{}})
	require.NoError(t, err)
	keys = append(keys, late.Key)
	waitCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	res, err = client.Wait(waitCtx, late.Key)
	cancel()
	require.NoError(t, err, "the idle dispatcher must hear of the key submitted through the pooler")
	require.Equal(t, outbox.StateSucceeded, res.State)
	stop()

	// The reconciler re-presents an abandoned key.
	stranded, err := client.Submit(ctx, outbox.Call{RunID: "pgb-stranded", Step: 1, Tool: "echo", Args: map[string]any{}})
	require.NoError(t, err)
	pgoncetest.AbandonKeys(t, schema, time.Minute, stranded.Key)
	rec, err := reconcile.New(client, reconcile.Config{Grace: time.Millisecond, PruneDisabled: true})
	require.NoError(t, err)
	report, err := rec.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, report.Examined["echo"])

	for _, key := range keys {
		n, ok := calls.Load(key)
		require.True(t, ok)
		require.Equal(t, int64(1), n.(*atomic.Int64).Load(), "calls of %s", key)
	}
}

// TestPgBouncerRefuses checks that what cannot work through a transaction
// pooler is refused with ErrTransactionPooling: a pgx pool that prepares
// statements, and a dispatcher that would listen through the pooler.
func TestPgBouncerRefuses(t *testing.T) {
	t.Parallel()
	bouncer := pgoncetest.NewPgBouncer(t, "127.0.0.1", 5432, 2)
	schema := pgoncetest.Schema(t)

	t.Run("PoolThatPreparesStatements", func(t *testing.T) {
		t.Parallel()
		pool := pooledPool(t, strings.TrimSuffix(bouncer.URL(), "&default_query_exec_mode=exec"))
		_, err := outbox.NewPgx(pool, outbox.Config{Schema: schema, Pooling: outbox.PoolingTransaction})
		require.ErrorIs(t, err, outbox.ErrTransactionPooling)
		require.ErrorIs(t, err, outbox.ErrInvalidConfig)
		require.ErrorContains(t, err, "default_query_exec_mode=exec")
	})

	t.Run("DatabaseSQLThatPreparesStatements", func(t *testing.T) {
		t.Parallel()
		config, err := pgx.ParseConfig(strings.TrimSuffix(bouncer.URL(), "&default_query_exec_mode=exec"))
		require.NoError(t, err)
		db := stdlib.OpenDB(*config)
		t.Cleanup(func() { _ = db.Close() })
		client, err := outbox.New(db, outbox.Config{Schema: schema, Pooling: outbox.PoolingTransaction})
		require.NoError(t, err, "New takes no connection")
		err = client.CheckSchema(t.Context())
		require.ErrorIs(t, err, outbox.ErrTransactionPooling)
		require.ErrorContains(t, err, "default_query_exec_mode=exec")

		config, err = pgx.ParseConfig(bouncer.URL())
		require.NoError(t, err)
		execDB := stdlib.OpenDB(*config)
		t.Cleanup(func() { _ = execDB.Close() })
		client, err = outbox.New(execDB, outbox.Config{Schema: schema, Pooling: outbox.PoolingTransaction})
		require.NoError(t, err)
		require.NoError(t, client.CheckSchema(t.Context()))
	})

	t.Run("DispatcherListeningThroughThePooler", func(t *testing.T) {
		t.Parallel()
		drivertest.Each(t, testRefuseListen[pgx.Tx], testRefuseListen[*sql.Tx])
	})

	t.Run("InvalidPooling", func(t *testing.T) {
		t.Parallel()
		_, err := outbox.NewPgx(pgoncetest.Pool(t), outbox.Config{Schema: schema, Pooling: outbox.Pooling(7)})
		require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	})
}

func testRefuseListen[TTx any](t *testing.T, d drivertest.Driver[TTx]) {
	bouncer := pgoncetest.NewPgBouncer(t, "127.0.0.1", 5432, 2)
	pool := pooledPool(t, bouncer.URL())
	schema := pgoncetest.Schema(t)
	client := d.ClientOver(t, pool, outbox.Config{Schema: schema, Pooling: outbox.PoolingTransaction})
	_, err := dispatcher.New(client, dispatcher.Config{})
	require.ErrorIs(t, err, outbox.ErrTransactionPooling)
	require.ErrorIs(t, err, dispatcher.ErrInvalidConfig)

	// Polling only works, and so does a direct listening connection.
	polling := d.ClientOver(t, pool, outbox.Config{Schema: schema, Pooling: outbox.PoolingTransaction, NotifyDisabled: true})
	_, err = dispatcher.New(polling, dispatcher.Config{})
	require.NoError(t, err)
	directURL := pgoncetest.DatabaseURL(t)
	listening := d.ClientOver(t, pool, outbox.Config{
		Schema: schema, Pooling: outbox.PoolingTransaction,
		ListenConnectFunc: func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, directURL) },
	})
	_, err = dispatcher.New(listening, dispatcher.Config{})
	require.NoError(t, err)
}

// TestPgBouncerFaults drains a history-checked load through a PgBouncer in
// transaction pooling mode, on both drivers, while the PgBouncer drops
// its server connections (RECONNECT), holds every client (PAUSE, then
// RESUME), and is killed and started again: nothing lost, nothing twice,
// and every Wait ends with its key's result.
func TestPgBouncerFaults(t *testing.T) {
	t.Parallel()
	for _, drv := range []driver{driverPgx, driverStd} {
		t.Run(string(drv), func(t *testing.T) {
			t.Parallel()
			bouncer := pgoncetest.NewPgBouncer(t, "127.0.0.1", 5432, 4)
			b := setup(t, &bundleOpts{
				driver: drv, databaseURL: bouncer.URL(), transactionPooled: true,
				latency: 2 * time.Millisecond, mode: failTransientOneInTen,
			})
			var waits waiters
			for range 6 {
				if key, fate := b.load.SubmitOne(t.Context()); fate == faults.FateCommitted {
					waits.wait(b.client, key)
				}
			}
			stopSubmit := b.submit(t, 2, 5*time.Millisecond)
			stopDispatch := b.runDispatcher(t)
			stopReconcile := b.runReconciler(t)
			ctx := t.Context()
			for range faults.Scale(1, 4) {
				time.Sleep(300 * time.Millisecond) // load runs between faults
				require.NoError(t, bouncer.Admin(ctx, "RECONNECT"))
				tally.Fault("pgbouncer_reconnect")

				time.Sleep(300 * time.Millisecond)
				require.NoError(t, bouncer.Admin(ctx, "PAUSE"))
				tally.Fault("pgbouncer_pause")
				time.Sleep(200 * time.Millisecond) // clients queue meanwhile
				require.NoError(t, bouncer.Admin(ctx, "RESUME"))

				time.Sleep(300 * time.Millisecond)
				bouncer.Kill()
				tally.Fault("pgbouncer_kill")
				time.Sleep(100 * time.Millisecond) // clients find it gone
				bouncer.Start()
			}
			time.Sleep(300 * time.Millisecond)
			stopSubmit()
			stopDispatch()
			stopReconcile()
			awaitHealthy(t, b.workers)
			b.finish(t, faults.CheckOpts{})
			waits.require(t, "Client.Wait must outlast PgBouncer's faults")
		})
	}
}
