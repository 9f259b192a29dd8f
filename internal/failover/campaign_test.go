package failover_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/failover"
	"github.com/pgonce/pgonce/internal/faults"
	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/migrations"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/reconcile"
)

// Timings of the campaign: short leases, so that the leases that the
// failover strands expire soon; in the quick profile those of the fault
// campaign. The long profile runs several campaigns at once under the race
// detector, where a provider call of 1s timed out before it acted (and an
// at-most-once call went to review instead of acting twice), so its calls
// get longer.
var (
	callTimeout = faults.Scale(time.Second, 5*time.Second)
	lease       = faults.Scale(2*time.Second, 7*time.Second)
	grace       = faults.Scale(time.Second, 2*time.Second)
)

// quietLogger drops the library's logs, which a failover produces by the
// hundred; PGONCE_FAULTS_LOG=debug shows them all.
func quietLogger() *slog.Logger {
	level := slog.LevelError + 4
	if os.Getenv("PGONCE_FAULTS_LOG") == "debug" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// campaignOpts choose a campaign.
type campaignOpts struct {
	mode failover.Replication
	// replicatedClaims registers the ledger's tools with
	// outbox.ToolOpts.ReplicatedClaim.
	replicatedClaims bool
}

func (o campaignOpts) name() string {
	if o.replicatedClaims {
		return o.mode.String() + "+replicated_claim"
	}
	return o.mode.String()
}

// firstClaim is a middleware that notes the first provider call after
// arm's time: the first call of a claim on the promoted standby, since the
// old primary was gone by then.
type firstClaim struct {
	armed atomic.Int64 // unix nanoseconds; 0 until armed
	first atomic.Int64
}

func (f *firstClaim) AroundProvider(ctx context.Context, call *outbox.ProviderCall, next func(ctx context.Context) outbox.ProviderResult) outbox.ProviderResult {
	if armed := f.armed.Load(); armed != 0 && call.Op == outbox.ProviderOpCall {
		if now := time.Now().UnixNano(); now > armed {
			f.first.CompareAndSwap(0, now)
		}
	}
	return next(ctx)
}

// waiters run Client.Wait on keys across the failover, and note what they
// were told: a success is an outcome that must survive.
type waiters struct {
	history *faults.History
	wg      sync.WaitGroup
	mu      sync.Mutex
	n       int
	errs    []error
}

func (w *waiters) wait(waitFunc func(ctx context.Context, key outbox.Key) (outbox.Result, error), key outbox.Key) {
	w.mu.Lock()
	w.n++
	w.mu.Unlock()
	w.wg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		res, err := waitFunc(ctx, key)
		if err == nil && res.State.InProgress() {
			err = fmt.Errorf("wait returned %s", res.State)
		}
		if err != nil {
			w.mu.Lock()
			w.errs = append(w.errs, fmt.Errorf("wait %s: %w", key, err))
			w.mu.Unlock()
			return
		}
		if res.State == outbox.StateSucceeded {
			w.history.Observe(key, res.Response)
		}
	})
}

// background runs f until the returned stop is called or the test ends;
// stop waits for f to return.
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
			case <-time.After(time.Minute):
				t.Errorf("%s did not return within a minute of its context's end", name)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// awaitCondition polls cond until it holds, for up to a minute, and fails
// t then, saying what it waited for.
func awaitCondition(t *testing.T, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var err error
	for ctx.Err() == nil {
		var ok bool
		if ok, err = cond(ctx); ok && err == nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("waited a minute for %s (last error: %v)", what, err)
}

// campaign runs the fault campaign's load through a failover of a pair in
// opts' mode, and returns its figures. The load: calls of the ledger's
// keyed, natural-id and at-most-once tools submitted in pgx.Tx and in
// *sql.Tx and run inline with Do; a dispatcher over each driver; a
// reconciler; waits on every fourth submitted call. Every client reaches the
// pair through its multi-host URL, and none is restarted.
//
//  1. Everything runs for a while.
//  2. The dispatchers stop while the submits go on, until a backlog of
//     pending calls is replicated to the standby.
//  3. The standby stops receiving WAL, and the dispatchers start again.
//     The campaign waits until a claim of the backlog waits for the
//     standby (where claims do) or an at-most-once call of the backlog
//     acted under a claim the standby never saw (where they do not).
//  4. The primary is stopped (immediate mode) and the standby promoted.
//  5. Everything goes on against the new primary for a while; both
//     dispatchers' listeners must reconnect to it.
//  6. The submits stop; once every call the new primary holds is finished,
//     the history is checked against it and the ledger.
func campaign(t *testing.T, opts campaignOpts) *failover.Figures {
	t.Helper()
	began := time.Now()
	phase := func(name string) { t.Logf("%s: %s", time.Since(began).Round(time.Millisecond), name) }
	pair := failover.NewPair(t, opts.mode)
	phase("pair made")
	ctx := t.Context()
	url := pair.URL()

	// pgonce's tables on the pair; the ledger on the test database, which
	// does not fail over, as the downstream systems it models do not.
	schema := pgoncetest.NewSchemaName(t)
	direct, err := faults.NewPool(ctx, url, "failover_checker")
	require.NoError(t, err)
	t.Cleanup(direct.Close)
	migrateDB := stdlib.OpenDBFromPool(direct)
	require.NoError(t, migrations.Up(ctx, migrateDB, schema))
	require.NoError(t, migrateDB.Close())
	ledgerPool := pgoncetest.Pool(t)
	ledgerSchema := pgoncetest.Schema(t)
	require.NoError(t, faults.CreateLedger(ctx, ledgerPool, ledgerSchema))
	ledger := faults.NewLedger(ledgerPool, ledgerSchema)
	ledger.Latency = 2 * time.Millisecond
	var toolOpts *outbox.ToolOpts
	if opts.replicatedClaims {
		toolOpts = &outbox.ToolOpts{ReplicatedClaim: true}
	}
	registry, err := ledger.Registry(toolOpts)
	require.NoError(t, err)

	first := &firstClaim{}
	config := outbox.Config{
		Schema: schema, Registry: registry, CallTimeout: callTimeout, Lease: lease,
		Logger: quietLogger(), Middleware: []outbox.Middleware{first},
	}
	pgxPool, err := faults.NewPool(ctx, url, "failover_pgx")
	require.NoError(t, err)
	t.Cleanup(pgxPool.Close)
	stdDB, err := faults.NewDB(url, "failover_std")
	require.NoError(t, err)
	t.Cleanup(func() { _ = stdDB.Close() })
	pgxClient, err := outbox.NewPgx(pgxPool, config)
	require.NoError(t, err)
	stdClient, err := outbox.New(stdDB, config)
	require.NoError(t, err)
	checkerConfig := config
	checkerConfig.Middleware = nil
	checker, err := outbox.NewPgx(direct, checkerConfig)
	require.NoError(t, err)

	history := faults.NewHistory()
	var run [4]byte
	_, _ = rand.Read(run[:])
	runID := "failover-" + hex.EncodeToString(run[:])
	pgxLoad := &faults.Workload{Client: faults.PgxSubmitter(pgxClient, pgxPool), History: history, RunID: runID + "-pgx", RollbackEvery: 7}
	stdLoad := &faults.Workload{Client: faults.StdSubmitter(stdClient, stdDB), History: history, RunID: runID + "-std", RollbackEvery: 7}
	doLoad := &faults.Workload{Client: faults.PgxSubmitter(pgxClient, pgxPool), History: history, RunID: runID + "-do", DoAsks: 2}
	waits := &waiters{history: history}

	pause := 10 * time.Millisecond
	submitLoop := func(load *faults.Workload, waitFunc func(ctx context.Context, key outbox.Key) (outbox.Result, error)) func(ctx context.Context) {
		return func(ctx context.Context) {
			for i := 0; ctx.Err() == nil; i++ {
				if key, fate := load.SubmitOne(ctx); fate == faults.FateCommitted && i%4 == 0 {
					waits.wait(waitFunc, key)
				}
				select {
				case <-ctx.Done():
				case <-time.After(pause):
				}
			}
		}
	}
	stopPgx := background(t, "pgx submits", submitLoop(pgxLoad, pgxClient.Wait))
	stopStd := background(t, "database/sql submits", submitLoop(stdLoad, stdClient.Wait))
	stopDo := background(t, "Do", func(ctx context.Context) { doLoad.Run(ctx, 1, 0, 2*pause) })
	stopReconcile := background(t, "the reconciler", func(ctx context.Context) {
		r, err := reconcile.New(pgxClient, reconcile.Config{Grace: grace, PruneDisabled: true})
		if err == nil {
			err = r.Run(ctx, 100*time.Millisecond)
		}
		if err != nil && ctx.Err() == nil {
			t.Errorf("reconciler: %v", err)
		}
	})
	dispatchers := func() (stop func()) {
		// The library's defaults (backoffs, poll interval, listener) but a
		// short shutdown: they are what a failover tests.
		config := dispatcher.Config{ShutdownTimeout: 2 * time.Second}
		pgxD, err := dispatcher.New(pgxClient, config)
		require.NoError(t, err)
		stdD, err := dispatcher.New(stdClient, config)
		require.NoError(t, err)
		stopPgxD := background(t, "the pgx dispatcher", func(ctx context.Context) { _ = pgxD.Run(ctx) })
		stopStdD := background(t, "the database/sql dispatcher", func(ctx context.Context) { _ = stdD.Run(ctx) })
		return func() { stopPgxD(); stopStdD() }
	}

	// 1. Everything runs.
	stopDispatchers := dispatchers()
	time.Sleep(faults.Scale(time.Second, 5*time.Second))

	// 2. A backlog, replicated.
	phase("backlog")
	stopDispatchers()
	time.Sleep(faults.Scale(500*time.Millisecond, 3*time.Second))
	caughtCtx, cancel := context.WithTimeout(ctx, time.Minute)
	require.NoError(t, pair.AwaitCaughtUp(caughtCtx))
	cancel()

	// 3. The standby falls behind; the dispatchers claim the backlog.
	phase("cut")
	cut := time.Now()
	pair.CutStreaming()
	stopDispatchers = dispatchers()
	if opts.mode.Synchronous() || opts.replicatedClaims {
		awaitCondition(t, "a claim waiting for the standby", func(ctx context.Context) (bool, error) {
			var n int
			err := direct.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE wait_event = 'SyncRep' AND strpos(query, 'OutboxClaimBatch') > 0`).Scan(&n)
			return n > 0, err
		})
	} else {
		awaitCondition(t, "an at-most-once call acting under a claim the standby never saw", func(ctx context.Context) (bool, error) {
			return actedUnseen(ctx, ledgerPool, ledgerSchema, pair.Standby, schema, cut)
		})
	}
	time.Sleep(faults.Scale(200*time.Millisecond, 2*time.Second))

	// 4. The failover.
	phase("failover")
	stopped, promoted := pair.Failover()
	first.armed.Store(promoted.UnixNano())
	committedBefore := committedByRun(history)

	// 5. Everything goes on against the new primary; both dispatchers
	// listen there again.
	for _, app := range []string{"failover_pgx", "failover_std"} {
		awaitCondition(t, "the "+app+" dispatcher's listener on the new primary", func(ctx context.Context) (bool, error) {
			var n int
			err := direct.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE application_name = $1 AND query = $2`,
				app, "LISTEN "+ident.Quote(ident.WorkChannel(schema))).Scan(&n)
			return n > 0, err
		})
	}
	phase("listeners back")
	time.Sleep(faults.Scale(2*time.Second, 10*time.Second))

	// 6. Finish and check.
	phase("finish")
	stopPgx()
	stopStd()
	stopDo()
	committedAfter := committedByRun(history)
	for _, load := range []*faults.Workload{pgxLoad, stdLoad, doLoad} {
		require.Greater(t, committedAfter[load.RunID], committedBefore[load.RunID],
			"%s committed nothing on the new primary", load.RunID)
	}
	finishCtx, cancel := context.WithTimeout(ctx, faults.Scale(time.Minute, 3*time.Minute))
	open, err := faults.AwaitTerminal(finishCtx, direct, schema, history.Keys())
	cancel()
	require.NoError(t, err, "%d calls the new primary holds did not finish", open)
	stopDispatchers()
	stopReconcile()
	waited := make(chan struct{})
	go func() { waits.wg.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(time.Minute):
		t.Fatal("waits did not return within a minute of every call's end")
	}

	checkCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	phase("check")
	defer cancel()
	f, err := failover.Measure(checkCtx, direct, schema, ledgerPool, ledgerSchema, history)
	require.NoError(t, err)
	f.Mode = opts.name()
	f.Waits, f.WaitErrors = waits.n, len(waits.errs)
	f.Promotion = promoted.Sub(stopped)
	if at := first.first.Load(); at != 0 {
		f.FirstClaim = time.Unix(0, at).Sub(stopped)
	}
	require.NoError(t, failover.CopyLedger(checkCtx, ledgerPool, ledgerSchema, direct, schema))
	report, err := faults.Check(checkCtx, direct, schema, checker, history, faults.CheckOpts{Crashed: true})
	require.NoError(t, err)
	t.Logf("%s\nhistory: %s\nlost: %v", f, report.Summary(), f.LostCalls)
	record(f)

	if opts.mode.Synchronous() && f.Lost > 0 {
		// Say whether the old primary had committed what the new one lacks.
		stopDispatchers()
		pair.StartOldPrimary()
		for _, key := range f.LostKeys {
			var state string
			var created time.Time
			conn, err := pgx.Connect(checkCtx, pair.Primary.URL())
			require.NoError(t, err)
			err = conn.QueryRow(checkCtx, `SELECT state::text, created_at FROM `+ident.Quote(schema)+`.pgonce_key
				WHERE key = decode(substr($1, 4), 'hex')`, key).Scan(&state, &created)
			_ = conn.Close(checkCtx)
			t.Logf("lost key %s on the old primary: state %q created %s (stopped %s, promoted %s): %v",
				key, state, created.Format(time.RFC3339Nano), stopped.Format(time.RFC3339Nano), promoted.Format(time.RFC3339Nano), err)
		}
	}
	if !opts.mode.Synchronous() {
		stopDispatchers()
		requireDiffListsLostKeys(checkCtx, t, pair, schema, f)
	}
	require.NotZero(t, f.FirstClaim, "no claim on the new primary")
	require.Zero(t, f.Duplicates[faults.ToolKeyed], "keyed calls are deduplicated by their provider, whatever the store forgot")
	require.Zero(t, report.Unfinished, "every call the new primary holds finishes")
	require.Zero(t, report.NeedlessReview, "keyed and natural-id calls never need review")
	if opts.mode.Synchronous() {
		require.NoError(t, report.Err(), "a synchronous standby loses nothing")
		require.Zero(t, f.Duplicated(), "duplicates")
		require.Zero(t, f.Lost, "lost keys")
		require.Zero(t, f.ClaimsForgotten, "claims forgotten")
		require.Zero(t, f.OutcomesDropped, "known outcomes dropped")
		require.Empty(t, waits.errs, "waits across the failover")
	}
	return f
}

// requireDiffListsLostKeys starts the old primary again, read-only for its
// clients, and requires [outbox.FailoverDiff] against the promoted standby
// to list as missing every key the campaign found lost, and at least as
// many keys as it lost, as many of them acted: the old primary may also
// hold commits whose acknowledgement never reached their caller.
func requireDiffListsLostKeys(ctx context.Context, t *testing.T, pair *failover.Pair, schema string, f *failover.Figures) {
	t.Helper()
	pair.StartOldPrimary()
	oldPool, err := pgxpool.New(ctx, pair.Primary.URL()+"&options=-c%20default_transaction_read_only%3Don")
	require.NoError(t, err)
	defer oldPool.Close()
	newPool, err := pgxpool.New(ctx, pair.Standby.URL())
	require.NoError(t, err)
	defer newPool.Close()
	oldClient, err := outbox.NewPgx(oldPool, outbox.Config{Schema: schema})
	require.NoError(t, err)
	newClient, err := outbox.NewPgx(newPool, outbox.Config{Schema: schema})
	require.NoError(t, err)

	missing := map[string]bool{}
	acted := 0
	var cursor string
	for {
		res, err := outbox.FailoverDiff(ctx, oldClient, newClient, outbox.FailoverDiffParams{Cursor: cursor})
		require.NoError(t, err)
		for _, k := range res.Keys {
			if k.Missing() {
				missing[string(k.Old.Key)] = true
				if k.Acted {
					acted++
				}
			}
		}
		if cursor = res.Cursor; cursor == "" {
			break
		}
	}
	t.Logf("failover diff: %d keys missing on the new primary (%d acted), %d lost (%d acted)", len(missing), acted, f.Lost, f.LostActed)
	require.GreaterOrEqual(t, len(missing), f.Lost, "the diff lists every lost key")
	require.GreaterOrEqual(t, acted, f.LostActed, "the diff says that every lost key that acted did")
	for _, key := range f.LostKeys {
		require.True(t, missing[key], "lost key %s is not in the diff", key)
	}
}

// committedByRun counts the history's committed calls per run id.
func committedByRun(h *faults.History) map[string]int {
	n := map[string]int{}
	for _, e := range h.Entries() {
		if e.Fate == faults.FateCommitted {
			n[e.Call.RunID]++
		}
	}
	return n
}

// actedUnseen reports whether an at-most-once call acted after cut while
// the standby holds its key pending: the claim it acted under is the
// primary's alone, and a promoted standby would run it again.
func actedUnseen(ctx context.Context, ledger *pgxpool.Pool, ledgerSchema string, standby *failover.Node, schema string, cut time.Time) (bool, error) {
	rows, err := ledger.Query(ctx, `SELECT decode(substr(key, 4), 'hex') FROM `+ident.Quote(ledgerSchema)+`.faults_attempt
		WHERE tool = $1 AND at > $2`, faults.ToolOnce, cut)
	if err != nil {
		return false, err
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil || len(keys) == 0 {
		return false, err
	}
	conn, err := pgx.Connect(ctx, standby.URL())
	if err != nil {
		return false, err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	var n int
	err = conn.QueryRow(ctx, `SELECT count(*) FROM `+ident.Quote(schema)+`.pgonce_key
		WHERE key = ANY($1) AND state = 'open' AND lease_until IS NULL`, keys).Scan(&n)
	return n > 0, err
}

var (
	figuresMu sync.Mutex
	figures   []*failover.Figures
)

func record(f *failover.Figures) {
	figuresMu.Lock()
	defer figuresMu.Unlock()
	figures = append(figures, f)
}
