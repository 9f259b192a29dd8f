package reconcile_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/reconcile"
)

const (
	childSchemaEnv = "PGONCE_TEST_RECONCILE_CHILD_SCHEMA"
	childURLEnv    = "PGONCE_TEST_RECONCILE_CHILD_URL"
	childDriverEnv = "PGONCE_TEST_RECONCILE_CHILD_DRIVER"
)

// Timings of the crash test. The lease is short so that the leases of killed
// workers expire soon; it exceeds the call timeout by outbox.LeaseMarginMin
// as the dispatcher requires.
const (
	crashCallTimeout = 2 * time.Second
	crashLease       = 3 * time.Second
)

// crashClientConfig is the client configuration of every process in the
// crash test.
func crashClientConfig(schema string, registry *outbox.Registry) outbox.Config {
	return outbox.Config{Schema: schema, Registry: registry, CallTimeout: crashCallTimeout, Lease: crashLease}
}

// crashDispatcherConfig is the dispatcher configuration of every process in
// the crash test. Its CallTimeout and Lease repeat crashClientConfig's.
func crashDispatcherConfig() dispatcher.Config {
	return dispatcher.Config{
		PollInterval: 50 * time.Millisecond,
		BatchSize:    50,
		Concurrency:  8,
	}
}

// ledger models downstream systems whose effects are rows of the ledger
// table, so that every process sees the same effects: one row per effect,
// marked with the pid of the process that caused it.
//
// In the dispatcher processes that the crash test kills, the ledger is
// gated: a call runs only with one of the tickets in the gate table, and a
// call without one is held until its process stops: the first call of
// each tool held before its effect, the second after it, and so on. Held
// calls are recorded in the held table. The test kills the processes once
// every ticket's call is recorded and calls are held, so what a kill
// interrupts is decided by the barrier, not by timing.
type ledger struct {
	pool   *pgxpool.Pool
	schema string // quoted
	pid    int
	// gate, when not nil, makes the ledger gated; it is closed when the
	// process stops, and releases the held calls with an error.
	gate <-chan struct{}
}

// response is what a provider of the ledger returns for an effect made by
// pid.
func response(pid int) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"pid":%d}`, pid))
}

// gated runs effect, a provider's call, through the ledger's gate (see
// [ledger]). Its statements ignore the call timeout: a ticket's call cut off
// on a loaded machine would leave the test waiting for its outcome.
func (l *ledger) gated(ctx context.Context, req outbox.Request, effect func(context.Context) (json.RawMessage, error)) (json.RawMessage, error) {
	if l.gate == nil {
		return effect(ctx)
	}
	ctx = context.WithoutCancel(ctx)
	tag, err := l.pool.Exec(ctx, `UPDATE `+l.schema+`.gate SET tickets = tickets - 1 WHERE tickets > 0`)
	if err != nil {
		return nil, err
	}
	if tag.RowsAffected() == 1 {
		return effect(ctx)
	}
	var arrival int
	if err := l.pool.QueryRow(ctx, `UPDATE `+l.schema+`.arrivals SET held = held + 1 WHERE tool = $1 RETURNING held`,
		req.Tool).Scan(&arrival); err != nil {
		return nil, err
	}
	afterEffect := arrival%2 == 0
	if afterEffect {
		if _, err := effect(ctx); err != nil {
			return nil, err
		}
	}
	if _, err := l.pool.Exec(ctx, `INSERT INTO `+l.schema+`.held (key, tool, after_effect) VALUES ($1, $2, $3)`,
		string(req.Key), req.Tool, afterEffect); err != nil {
		return nil, err
	}
	<-l.gate
	return nil, errors.New("held at the gate until the process stopped")
}

// keyedProvider deduplicates on the key it is given, as an API taking an
// Idempotency-Key header does: a key presented again causes no second effect
// and gets the first effect's response.
type keyedProvider struct{ *ledger }

func (p keyedProvider) Call(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
	return p.gated(ctx, req, func(ctx context.Context) (json.RawMessage, error) { return p.call(ctx, req) })
}

func (p keyedProvider) call(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
	// The final SELECT reads the snapshot taken before the statement: it sees
	// the first effect's pid when the key was already there, and claimed's
	// row when this call made the effect.
	var pid int
	err := p.pool.QueryRow(ctx, `
		WITH claimed AS (
			INSERT INTO `+p.schema+`.effects_keyed (key, pid)
			VALUES ($1::text, $3::int)
			ON CONFLICT (key) DO NOTHING
			RETURNING pid
		),
		effect AS (
			INSERT INTO `+p.schema+`.ledger (natural_id, tool, pid)
			SELECT $2::text, 'refund', pid FROM claimed
		)
		SELECT pid FROM claimed
		UNION ALL
		SELECT pid FROM `+p.schema+`.effects_keyed WHERE key = $1::text`,
		string(req.Key), req.NaturalID, p.pid).Scan(&pid)
	if err != nil {
		return nil, err
	}
	return response(pid), nil
}

// lookupProvider can be asked whether the action with a natural id happened,
// but does not deduplicate: a second call is a second effect.
type lookupProvider struct{ *ledger }

func (p lookupProvider) Call(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
	return p.gated(ctx, req, func(ctx context.Context) (json.RawMessage, error) { return p.insert(ctx, req) })
}

func (p lookupProvider) Lookup(ctx context.Context, req outbox.Request) (json.RawMessage, bool, error) {
	var pid int
	err := p.pool.QueryRow(ctx,
		`SELECT pid FROM `+p.schema+`.ledger WHERE natural_id = $1 AND tool = $2 LIMIT 1`,
		req.NaturalID, req.Tool).Scan(&pid)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, false, nil
	case err != nil:
		return nil, false, err
	}
	return response(pid), true, nil
}

// plainProvider can neither deduplicate nor be asked: every call is an
// effect.
type plainProvider struct{ *ledger }

func (p plainProvider) Call(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
	return p.gated(ctx, req, func(ctx context.Context) (json.RawMessage, error) { return p.insert(ctx, req) })
}

func (l *ledger) insert(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
	_, err := l.pool.Exec(ctx, `
		INSERT INTO `+l.schema+`.ledger (natural_id, tool, pid) VALUES ($1, $2, $3)`,
		req.NaturalID, req.Tool, l.pid)
	if err != nil {
		return nil, err
	}
	return response(l.pid), nil
}

// ledgerRegistry registers refund (deduplicated by key), provision (looked
// up by natural id) and email (at most once) over the ledger in schema,
// gated by gate when it is not nil (see [ledger]).
func ledgerRegistry(pool *pgxpool.Pool, schema string, gate <-chan struct{}) (*outbox.Registry, error) {
	l := &ledger{pool: pool, schema: ident.Quote(schema), pid: os.Getpid(), gate: gate}
	registry := outbox.NewRegistry()
	return registry, errors.Join(
		registry.Register("refund", keyedProvider{l}, outbox.IdempotentByKey),
		registry.Register("provision", lookupProvider{l}, outbox.LookupByNaturalID),
		registry.Register("email", plainProvider{l}, outbox.AtMostOnce),
	)
}

// childApplicationName names the connections of the child processes that
// work on schema, so that the test can tell when the server has ended them.
func childApplicationName(schema string) string { return "crash_child_" + schema }

// runChildDispatcher is the body of a dispatcher process of the crash test,
// over the driver its environment names. It runs until it is killed,
// signalled, or its standard input closes (the test process is gone).
func runChildDispatcher() int {
	return drivertest.RunChild(os.Getenv(childDriverEnv), runChildDispatcherOver[pgx.Tx], runChildDispatcherOver[*sql.Tx])
}

func runChildDispatcherOver[TTx any](driver drivertest.Driver[TTx]) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		stop()
	}()
	err := func() error {
		schema := os.Getenv(childSchemaEnv)
		config, err := pgxpool.ParseConfig(os.Getenv(childURLEnv))
		if err != nil {
			return err
		}
		config.ConnConfig.RuntimeParams["application_name"] = childApplicationName(schema)
		pool, err := pgxpool.NewWithConfig(ctx, config)
		if err != nil {
			return err
		}
		defer pool.Close()
		registry, err := ledgerRegistry(pool, schema, ctx.Done())
		if err != nil {
			return err
		}
		client, closeClient, err := driver.Open(pool, crashClientConfig(schema, registry))
		if err != nil {
			return err
		}
		defer closeClient()
		d, err := dispatcher.New(client, crashDispatcherConfig())
		if err != nil {
			return err
		}
		return d.Run(ctx)
	}()
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	return 0
}

func TestKilledDispatchersLeaveNoDoubleEffect(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testKilledDispatchersLeaveNoDoubleEffect[pgx.Tx], testKilledDispatchersLeaveNoDoubleEffect[*sql.Tx])
}

func testKilledDispatchersLeaveNoDoubleEffect[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()

	const (
		rows = 600
		// killAfter is how many calls the children may make (the gate's
		// tickets), all finished before the kill: enough to know the children
		// work, few enough that most rows are left.
		killAfter = 30
	)

	type testBundle struct {
		client *outbox.Client[TTx]
		pool   *pgxpool.Pool
		schema string
		quoted string
		tools  map[string]string
		keys   map[string]outbox.Key // by natural id
	}

	setup := func(t *testing.T) *testBundle {
		t.Helper()
		schema := pgoncetest.Schema(t)
		pool := pgoncetest.Pool(t)
		quoted := ident.Quote(schema)
		_, err := pool.Exec(t.Context(), `
			CREATE TABLE `+quoted+`.ledger (natural_id text NOT NULL, tool text NOT NULL, pid integer NOT NULL);
			CREATE TABLE `+quoted+`.effects_keyed (key text PRIMARY KEY, pid integer NOT NULL);
			CREATE TABLE `+quoted+`.gate (tickets integer NOT NULL);
			CREATE TABLE `+quoted+`.arrivals (tool text PRIMARY KEY, held integer NOT NULL);
			CREATE TABLE `+quoted+`.held (key text PRIMARY KEY, tool text NOT NULL, after_effect boolean NOT NULL);`)
		require.NoError(t, err)
		_, err = pool.Exec(t.Context(), `
			INSERT INTO `+quoted+`.gate (tickets) VALUES (`+strconv.Itoa(killAfter)+`);
			INSERT INTO `+quoted+`.arrivals (tool, held) VALUES ('refund', 0), ('provision', 0), ('email', 0);`)
		require.NoError(t, err)
		registry, err := ledgerRegistry(pool, schema, nil)
		require.NoError(t, err)
		client := driver.Client(t, crashClientConfig(schema, registry))

		bundle := &testBundle{
			client: client,
			pool:   pool,
			schema: schema,
			quoted: quoted,
			tools:  map[string]string{},
			keys:   map[string]outbox.Key{},
		}
		calls := make([]outbox.Call, rows)
		for i := range calls {
			calls[i] = outbox.Call{
				RunID: "crash", Step: int64(i), Tool: []string{"refund", "provision", "email"}[i%3],
				NaturalID: fmt.Sprintf("nat-%d", i), Args: map[string]any{"i": i},
			}
		}
		for i, key := range driver.SubmitKeys(t, client, calls) {
			bundle.tools[calls[i].NaturalID] = calls[i].Tool
			bundle.keys[calls[i].NaturalID] = key
		}
		return bundle
	}

	count := func(t *testing.T, bundle *testBundle, query string) int {
		t.Helper()
		var n int
		require.NoError(t, bundle.pool.QueryRow(t.Context(), query).Scan(&n))
		return n
	}

	bundle := setup(t)

	// Three dispatcher processes work through the rows.
	type child struct {
		cmd    *exec.Cmd
		stdin  io.WriteCloser
		stderr *bytes.Buffer
	}
	var children []child
	killed := false
	kill := func() {
		if killed {
			return
		}
		killed = true
		for _, c := range children {
			_ = c.cmd.Process.Kill()
		}
		for i, c := range children {
			_ = c.cmd.Wait()
			// Wait has copied all of stderr; a child that failed says why.
			if c.stderr.Len() > 0 {
				t.Logf("child %d stderr:\n%s", i, c.stderr)
			}
		}
	}
	t.Cleanup(kill)
	for range 3 {
		cmd := exec.Command(os.Args[0], "-test.run=^$") //nolint:gosec // the test binary itself
		cmd.Env = append(os.Environ(),
			childSchemaEnv+"="+bundle.schema,
			childURLEnv+"="+driver.URL(t),
			childDriverEnv+"="+driver.Name)
		stderr := &bytes.Buffer{}
		cmd.Stderr = stderr
		// The child exits when this pipe closes, should the test process die
		// before it kills the child. Wait closes it.
		stdin, err := cmd.StdinPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		children = append(children, child{cmd: cmd, stdin: stdin, stderr: stderr})
	}

	// Once every ticket's call is recorded and the children hold calls both
	// before and after their effects, kill every child mid-work: the rows
	// they had claimed stay in flight under leases nobody will release. No
	// more calls can finish, since the children make none without a
	// ticket. Each child keeps at least half its Concurrency claimed, so
	// some tool has two calls held, one of each kind.
	require.Eventually(t, func() bool {
		var finished, heldBefore, heldAfter int
		err := bundle.pool.QueryRow(context.Background(), `
			SELECT
				(SELECT count(*) FROM `+bundle.quoted+`.pgonce_key WHERE state <> 'open'),
				(SELECT count(*) FROM `+bundle.quoted+`.held WHERE NOT after_effect),
				(SELECT count(*) FROM `+bundle.quoted+`.held WHERE after_effect)`).Scan(&finished, &heldBefore, &heldAfter)
		return err == nil && finished == killAfter && heldBefore > 0 && heldAfter > 0
	}, time.Minute, 5*time.Millisecond)
	kill()
	for i, c := range children {
		require.NotContains(t, c.stderr.String(), "DATA RACE", "child %d", i)
	}
	// A killed child's statements run on in the server until they end and
	// the server notices the closed connection; count once they are over.
	// An idle backend that still carries a child's name runs nothing and
	// holds no transaction: behind PgBouncer, the server connection the
	// child last used stays in the pool.
	require.Eventually(t, func() bool {
		var backends int
		err := bundle.pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state IS DISTINCT FROM 'idle'`,
			childApplicationName(bundle.schema)).Scan(&backends)
		return err == nil && backends == 0
	}, time.Minute, 5*time.Millisecond)
	finishedAtKill := count(t, bundle, `SELECT count(*) FROM `+bundle.quoted+`.pgonce_key WHERE state <> 'open'`)
	inFlightAtKill := count(t, bundle, `SELECT count(*) FROM `+bundle.quoted+`.pgonce_key WHERE lease_until IS NOT NULL`)
	heldBefore := count(t, bundle, `SELECT count(*) FROM `+bundle.quoted+`.held WHERE NOT after_effect`)
	heldAfter := count(t, bundle, `SELECT count(*) FROM `+bundle.quoted+`.held WHERE after_effect`)
	t.Logf("at the kill: %d of %d keys finished, %d in flight, of which %d held before their effect and %d after it",
		finishedAtKill, rows, inFlightAtKill, heldBefore, heldAfter)
	require.Equal(t, killAfter, finishedAtKill, "only the tickets' calls finish before the kill")
	require.GreaterOrEqual(t, inFlightAtKill, heldBefore+heldAfter, "every held call's row is in flight")

	// The dead workers' leases run out; the reconciler takes every row
	// whose lease ended more than its grace ago.
	require.Eventually(t, func() bool {
		var live int
		err := bundle.pool.QueryRow(context.Background(), `
			SELECT count(*) FROM `+bundle.quoted+`.pgonce_key
			WHERE lease_until >= now() - interval '1 millisecond'`).Scan(&live)
		return err == nil && live == 0
	}, time.Minute, 20*time.Millisecond)
	r, err := reconcile.New(bundle.client, reconcile.Config{Grace: time.Millisecond})
	require.NoError(t, err)
	report, err := r.RunOnce(t.Context())
	require.NoError(t, err)
	examined := 0
	for _, n := range report.Examined {
		examined += n
	}
	reportJSON, err := json.Marshal(report)
	require.NoError(t, err)
	t.Logf("reconcile report: %s", reportJSON)
	require.Positive(t, examined, "the kill must leave rows in flight for the reconciler")
	require.Equal(t, inFlightAtKill, examined, "every row in flight at the kill is examined")
	require.Empty(t, report.SkippedUnregistered)
	require.Zero(t, count(t, bundle, `SELECT count(*) FROM `+bundle.quoted+`.pgonce_key WHERE lease_until IS NOT NULL`),
		"nothing is left in flight after reconciling")

	// A fresh dispatcher finishes the rest.
	d, err := dispatcher.New(bundle.client, crashDispatcherConfig())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	var runErr error
	runDone := make(chan struct{})
	go func() {
		defer close(runDone)
		runErr = d.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-runDone
	})
	require.Eventually(t, func() bool {
		var open int
		err := bundle.pool.QueryRow(context.Background(),
			`SELECT count(*) FROM `+bundle.quoted+`.pgonce_key WHERE state = 'open'`).Scan(&open)
		return err == nil && open == 0
	}, time.Minute, 20*time.Millisecond)
	cancel()
	<-runDone
	require.NoError(t, runErr)

	// Every effect happened as its delivery mode promises.
	effects := map[string][]int{} // pids by natural id
	ledgerRows, err := bundle.pool.Query(t.Context(), `SELECT natural_id, pid FROM `+bundle.quoted+`.ledger`)
	require.NoError(t, err)
	for ledgerRows.Next() {
		var (
			naturalID string
			pid       int
		)
		require.NoError(t, ledgerRows.Scan(&naturalID, &pid))
		effects[naturalID] = append(effects[naturalID], pid)
	}
	require.NoError(t, ledgerRows.Err())

	reviewed := 0
	for naturalID, key := range bundle.keys {
		tool := bundle.tools[naturalID]
		res, err := bundle.client.Get(t.Context(), key)
		require.NoError(t, err)
		pids := effects[naturalID]
		switch tool {
		case "refund", "provision":
			require.Equal(t, outbox.StateSucceeded, res.State, "%s %s", tool, naturalID)
			require.Len(t, pids, 1, "%s %s: exactly one effect", tool, naturalID)
		case "email":
			require.LessOrEqual(t, len(pids), 1, "email %s: at most one effect", naturalID)
			if res.State != outbox.StateSucceeded {
				require.Equal(t, outbox.StateNeedsReview, res.State, "email %s", naturalID)
				reviewed++
				continue
			}
			require.Len(t, pids, 1, "email %s: succeeded, so it acted", naturalID)
		}
		// The stored response is the one of the effect that happened, even
		// when a lookup or a replayed key produced it.
		require.JSONEq(t, string(response(pids[0])), string(res.Response), "%s %s", tool, naturalID)
	}
	require.Equal(t, report.Examined["email"], report.Resolved["email"][reconcile.OutcomeNeedsReview],
		"the reconciler sends every stale email to review")
	require.GreaterOrEqual(t, reviewed, report.Examined["email"])
	require.Zero(t, count(t, bundle, `SELECT count(*) FROM `+bundle.quoted+`.pgonce_key WHERE state = 'open'`), "no key is left open")
	var extra int
	for naturalID := range effects {
		if _, ok := bundle.keys[naturalID]; !ok {
			extra++
		}
	}
	require.Zero(t, extra, "no effect without a key")
}
