package faults_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/url"
	"os"
	"strings"
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

// driver is the client library the workers use.
type driver string

// Drivers of the workers' client.
const (
	// driverPgx: outbox.NewPgx over a pgxpool, submits in pgx.Tx.
	driverPgx driver = "pgx"
	// driverStd: outbox.New over a database/sql pool (pgx's stdlib driver,
	// database/sql managing the connections), submits in *sql.Tx.
	driverStd driver = "std"
)

// bundleOpts tune [setup].
type bundleOpts struct {
	// driver is the workers' client library: their submits, dispatcher and
	// reconciler. Empty: driverPgx.
	driver driver
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
	// callTimeout and lease replace the campaign's when set.
	callTimeout, lease time.Duration
	// transactionPooled says that databaseURL is a transaction pooler: the
	// workers' clients take outbox.PoolingTransaction, and their listeners
	// connect to the direct database.
	transactionPooled bool
}

// bundle is one campaign: a schema with a ledger, the workers' pool and
// client, a direct pool for the checker, and the history.
type bundle struct {
	schema  string
	app     string // application_name of the workers' connections
	direct  *pgxpool.Pool
	workers *pgxpool.Pool
	ledger  *faults.Ledger
	client  *outbox.Client[pgx.Tx] // the workers' over pgx (also with driverStd)
	checker *outbox.Client[pgx.Tx] // over the direct pool
	history *faults.History
	load    *faults.Workload
	grace   time.Duration
	// dispatch and reconcile run a new dispatcher and reconciler over the
	// workers' client of the bundle's driver until ctx is done.
	dispatch  func(ctx context.Context) error
	reconcile func(ctx context.Context) error
}

// runners returns the dispatch and reconcile of a bundle over client.
func runners[TTx any](t *testing.T, client *outbox.Client[TTx], grace time.Duration) (dispatch, reconcileFunc func(ctx context.Context) error) {
	t.Helper()
	dispatch = func(ctx context.Context) error {
		d, err := dispatcher.New(client, dispatcherConfig())
		if err != nil {
			return err
		}
		return d.Run(ctx)
	}
	reconcileFunc = func(ctx context.Context) error {
		r, err := reconcile.New(client, reconcile.Config{Grace: grace, PruneDisabled: true})
		if err != nil {
			return err
		}
		return r.Run(ctx, 100*time.Millisecond)
	}
	// Fail at once on a bad configuration rather than in the background.
	_, err := dispatcher.New(client, dispatcherConfig())
	require.NoError(t, err)
	_, err = reconcile.New(client, reconcile.Config{Grace: grace, PruneDisabled: true})
	require.NoError(t, err)
	return dispatch, reconcileFunc
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
	workersConfig := clientConfig(schema, registry)
	workersConfig.CallTimeout = cmp.Or(opts.callTimeout, workersConfig.CallTimeout)
	workersConfig.Lease = cmp.Or(opts.lease, workersConfig.Lease)
	if opts.transactionPooled {
		directURL := pgoncetest.DatabaseURL(t)
		if opts.cluster != nil {
			directURL = opts.cluster.URL()
		}
		workersConfig.Pooling = outbox.PoolingTransaction
		workersConfig.ListenConnectFunc = func(ctx context.Context) (*pgx.Conn, error) {
			return pgx.Connect(ctx, directURL)
		}
	}
	client, err := outbox.NewPgx(workers, workersConfig)
	require.NoError(t, err)
	checker, err := outbox.NewPgx(direct, clientConfig(schema, registry))
	require.NoError(t, err)
	history := faults.NewHistory()
	var run [4]byte
	_, _ = rand.Read(run[:])
	b := &bundle{
		schema: schema, app: app, direct: direct, workers: workers, ledger: ledger,
		client: client, checker: checker, history: history, grace: cmp.Or(opts.grace, grace),
		load: &faults.Workload{
			Client: faults.PgxSubmitter(client, workers), History: history,
			RunID: "faults-" + hex.EncodeToString(run[:]), RollbackEvery: 7,
		},
	}
	switch cmp.Or(opts.driver, driverPgx) {
	case driverPgx:
		b.dispatch, b.reconcile = runners(t, client, b.grace)
	case driverStd:
		// Same application_name: the backend killer finds these too.
		db, err := faults.NewDB(url, app)
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		std, err := outbox.New(db, workersConfig)
		require.NoError(t, err)
		b.load.Client = faults.StdSubmitter(std, db)
		b.dispatch, b.reconcile = runners(t, std, b.grace)
	default:
		t.Fatalf("unknown driver %q", opts.driver)
	}
	return b
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

// runDispatcher runs a dispatcher over the workers' client (of the
// bundle's driver) until stop.
func (b *bundle) runDispatcher(t *testing.T) (stop func()) {
	t.Helper()
	return background(t, "Dispatcher.Run", func(ctx context.Context) { _ = b.dispatch(ctx) })
}

// runReconciler runs a reconciler over the workers' client (of the
// bundle's driver) until stop.
func (b *bundle) runReconciler(t *testing.T) (stop func()) {
	t.Helper()
	return background(t, "Reconciler.Run", func(ctx context.Context) { _ = b.reconcile(ctx) })
}

// minCommitted is how many calls a campaign's workload commits at least
// before its first fault and before it stops. A window of fixed length
// commits none on a loaded machine, and leaves the checker nothing to check.
const minCommitted = 3

// commitTimeout bounds the wait for the workload's committed calls.
const commitTimeout = 3 * time.Minute

// awaitCommitted waits until the workload has committed n calls in all,
// and fails t if it has not within commitTimeout.
func (b *bundle) awaitCommitted(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(commitTimeout)
	for b.history.Committed() < n {
		if time.Now().After(deadline) {
			t.Fatalf("the workload committed %d of %d calls within %s (history: %d calls, %d errors)",
				b.history.Committed(), n, commitTimeout, len(b.history.Entries()), b.load.Errors())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// submit runs the workload until stop: workers goroutines, each pausing
// between its calls. stop first waits until the workload has committed
// minCommitted calls in all.
func (b *bundle) submit(t *testing.T, workers int, pause time.Duration) (stop func()) {
	t.Helper()
	cancel := background(t, "the workload", func(ctx context.Context) { b.load.Run(ctx, workers, 0, pause) })
	return func() {
		t.Helper()
		b.awaitCommitted(t, minCommitted)
		cancel()
	}
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
	tally.Asks(b.load.Asks())
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

// campaignClient is a way the workers use the library in a campaign
// parameterised over it.
type campaignClient struct {
	name   string // the subtest's suffix
	suffix string // of the campaign's fault kinds in the summary
	driver driver
	// doAsks, when positive, runs the calls inline with Do, each asked by
	// up to doAsks concurrent callers, instead of submitting them.
	doAsks int
	mode   func(req outbox.Request) faults.Mode
	// short, in the quick profile, runs the campaign for half as long.
	short bool
}

// campaignClients are the pgx client submitting in pgx.Tx (the original
// campaign), the database/sql client submitting in *sql.Tx, and callers
// running calls inline with Client.Do, three duplicate asks at most, over
// a provider failing one first attempt in ten transiently (so that Do
// returns ErrProviderFailed and leaves the key to a dispatcher).
func campaignClients() []campaignClient {
	return []campaignClient{
		{name: "", driver: driverPgx},
		{name: "StdSQL", suffix: "_std", driver: driverStd, short: true},
		{name: "Do", suffix: "_do", driver: driverPgx, doAsks: 3, short: true, mode: failTransientOneInTen},
	}
}

// length is the campaign's length: quick or long, halved in the quick
// profile for a short one.
func (c campaignClient) length(quick, long time.Duration) time.Duration {
	if c.short {
		quick /= 2
	}
	return faults.Scale(quick, long)
}

// failTransientOneInTen fails the first attempt of one call in ten without
// acting.
func failTransientOneInTen(req outbox.Request) faults.Mode {
	if req.Attempt == 1 && strings.HasSuffix(req.NaturalID, "3") {
		tally.Fault("provider_fail_transient_do")
		return faults.ModeFailTransient
	}
	return faults.ModeReturn
}
