package faults_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/faults"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/migrations"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/reconcile"
)

// Timings of every campaign: short leases, so that the leases of stranded
// attempts expire soon. The lease exceeds the call timeout by
// outbox.LeaseMarginMin, as the dispatcher requires. The grace covers a live
// worker's record of a multi-megabyte outcome under the race detector on a
// loaded machine: with less, the reconciler takes over attempts whose
// answer is on its way to the store.
const (
	callTimeout = time.Second
	lease       = 2 * time.Second
	grace       = time.Second
)

// clientConfig is the client configuration of every campaign process.
func clientConfig(schema string, registry *outbox.Registry) outbox.Config {
	return outbox.Config{
		Schema: schema, Registry: registry, CallTimeout: callTimeout, Lease: lease,
		Logger: quietLogger(),
	}
}

// dispatcherConfig is the dispatcher configuration of every campaign
// process.
func dispatcherConfig() dispatcher.Config {
	return dispatcher.Config{
		CallTimeout:     callTimeout,
		Lease:           lease,
		PollInterval:    20 * time.Millisecond,
		BatchSize:       16,
		Concurrency:     8,
		BackoffMin:      10 * time.Millisecond,
		BackoffMax:      100 * time.Millisecond,
		ShutdownTimeout: 2 * time.Second,
	}
}

// quietLogger drops the library's logs below errors, which faults produce by
// the hundred; PGONCE_FAULTS_LOG=debug shows them all.
func quietLogger() *slog.Logger {
	level := slog.LevelError + 4
	if os.Getenv("PGONCE_FAULTS_LOG") == "debug" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// bundleOpts tune [setup].
type bundleOpts struct {
	// databaseURL is where the workers connect (a proxy, a private
	// cluster). Empty: the shared test database.
	databaseURL string
	// cluster, when set, holds the schema instead of the shared database.
	cluster *faults.Cluster
	// mode, when set, chooses each provider call's behaviour.
	mode func(req outbox.Request) faults.Mode
	// toolOpts apply to every ledger tool.
	toolOpts *outbox.ToolOpts
	// latency is spent before every provider call.
	latency time.Duration
	// hold is called after a provider call acted and before it answers.
	hold func(ctx context.Context, req outbox.Request)
	// grace is the reconciler's. Zero: the campaign's default.
	grace time.Duration
}

// bundle is one campaign: a schema with a ledger, the workers' pool and
// client, a direct pool for the checker, and the history.
type bundle struct {
	schema  string
	app     string // application_name of the workers' connections
	direct  *pgxpool.Pool
	workers *pgxpool.Pool
	ledger  *faults.Ledger
	client  *outbox.Client[pgx.Tx] // the workers'
	checker *outbox.Client[pgx.Tx] // over the direct pool
	history *faults.History
	load    *faults.Workload
	grace   time.Duration
}

func setup(t *testing.T, opts *bundleOpts) *bundle {
	t.Helper()
	if opts == nil {
		opts = &bundleOpts{}
	}
	ctx := t.Context()
	var schema string
	var direct *pgxpool.Pool
	if opts.cluster != nil {
		schema = pgoncetest.NewSchemaName(t)
		var err error
		direct, err = faults.NewPool(ctx, opts.cluster.URL(), "faults_checker")
		require.NoError(t, err)
		t.Cleanup(direct.Close)
		db := stdlib.OpenDBFromPool(direct)
		t.Cleanup(func() { _ = db.Close() })
		require.NoError(t, migrations.Up(ctx, db, schema))
	} else {
		schema = pgoncetest.Schema(t)
		direct = pgoncetest.Pool(t)
	}
	require.NoError(t, faults.CreateLedger(ctx, direct, schema))

	url := opts.databaseURL
	if url == "" {
		url = pgoncetest.DatabaseURL(t)
		if opts.cluster != nil {
			url = opts.cluster.URL()
		}
	}
	app := "faults_" + schema
	workers, err := faults.NewPool(ctx, url, app)
	require.NoError(t, err)
	t.Cleanup(workers.Close)

	// The ledger writes through the direct pool: the downstream systems it
	// models do not share the workers' network or connections.
	ledger := faults.NewLedger(direct, schema)
	ledger.ModeFunc, ledger.Latency, ledger.HoldFunc = opts.mode, opts.latency, opts.hold
	registry, err := ledger.Registry(opts.toolOpts)
	require.NoError(t, err)
	client, err := outbox.NewPgx(workers, clientConfig(schema, registry))
	require.NoError(t, err)
	checker, err := outbox.NewPgx(direct, clientConfig(schema, registry))
	require.NoError(t, err)
	history := faults.NewHistory()
	var run [4]byte
	_, _ = rand.Read(run[:])
	return &bundle{
		schema: schema, app: app, direct: direct, workers: workers, ledger: ledger,
		client: client, checker: checker, history: history, grace: cmp.Or(opts.grace, grace),
		load: &faults.Workload{
			Client: client, Pool: workers, History: history,
			RunID: "faults-" + hex.EncodeToString(run[:]), RollbackEvery: 7,
		},
	}
}

// stopTimeout bounds how long a background task may take to stop.
const stopTimeout = 20 * time.Second

// background runs f until the returned stop is called or the test ends;
// stop waits for f to return, and fails t if it does not within
// stopTimeout (the task is then left behind).
func background(t *testing.T, name string, f func(ctx context.Context)) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(ctx)
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(stopTimeout):
				t.Errorf("%s did not return within %s of its context's end", name, stopTimeout)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// runDispatcher runs a dispatcher over the workers' client until stop.
func (b *bundle) runDispatcher(t *testing.T) (stop func()) {
	t.Helper()
	d, err := dispatcher.New(b.client, dispatcherConfig())
	require.NoError(t, err)
	return background(t, "Dispatcher.Run", func(ctx context.Context) { _ = d.Run(ctx) })
}

// runReconciler runs a reconciler over the workers' client until stop.
func (b *bundle) runReconciler(t *testing.T) (stop func()) {
	t.Helper()
	r, err := reconcile.New(b.client, reconcile.Config{Grace: b.grace, PruneDisabled: true})
	require.NoError(t, err)
	return background(t, "Reconciler.Run", func(ctx context.Context) { _ = r.Run(ctx, 100*time.Millisecond) })
}

// submit runs the workload until stop: workers goroutines, each pausing
// between its calls.
func (b *bundle) submit(t *testing.T, workers int, pause time.Duration) (stop func()) {
	t.Helper()
	return background(t, "the workload", func(ctx context.Context) { b.load.Run(ctx, workers, 0, pause) })
}

// finish waits until every committed call is terminal, with a dispatcher
// and a reconciler running, then checks the history, adds it to the tally
// and fails t on any violation.
func (b *bundle) finish(t *testing.T, opts faults.CheckOpts) *faults.Report {
	t.Helper()
	stopD := b.runDispatcher(t)
	stopR := b.runReconciler(t)
	ctx, cancel := context.WithTimeout(t.Context(), faults.Scale(45*time.Second, 3*time.Minute))
	defer cancel()
	open, err := faults.AwaitTerminal(ctx, b.direct, b.schema, b.history.Keys())
	stopD()
	stopR()
	if err != nil {
		t.Errorf("%d committed calls did not finish: %v", open, err)
	}
	return b.check(t, opts)
}

// check checks the history, adds it to the tally and fails t on any
// violation.
func (b *bundle) check(t *testing.T, opts faults.CheckOpts) *faults.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 2*time.Minute)
	defer cancel()
	report, err := faults.Check(ctx, b.direct, b.schema, b.checker, b.history, opts)
	require.NoError(t, err)
	tally.Add(report)
	t.Logf("history: %s", report.Summary())
	require.NoError(t, report.Err())
	require.Positive(t, report.Committed, "the campaign committed calls")
	return report
}

// hostPort returns the host:port of a database URL.
func hostPort(t *testing.T, databaseURL string) string {
	t.Helper()
	u, err := url.Parse(databaseURL)
	require.NoError(t, err)
	return u.Host
}
