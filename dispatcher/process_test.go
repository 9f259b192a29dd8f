package dispatcher_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/httpprovider"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
)

const (
	childSchemaEnv = "PGONCE_TEST_CHILD_SCHEMA"
	childURLEnv    = "PGONCE_TEST_CHILD_URL"
	childDriverEnv = "PGONCE_TEST_CHILD_DRIVER"
	// childMaintenanceEnv, when set, makes the child's dispatcher run
	// maintenance every 100ms with a reconciler grace of 1ms, under the
	// worker id child-PID.
	childMaintenanceEnv = "PGONCE_TEST_CHILD_MAINTENANCE"
	// childFlowURLEnv, when set, makes the child's refund provider an
	// httpprovider that posts to this URL, under 100 slots.
	childFlowURLEnv = "PGONCE_TEST_CHILD_FLOW_URL"
)

// runChildDispatcher is the body of a dispatcher process: over the driver
// its environment names, it serves the refund tool with a provider that
// writes each effect to a ledger table, and runs until SIGTERM.
func runChildDispatcher() int {
	return drivertest.RunChild(os.Getenv(childDriverEnv), runChildDispatcherOver[pgx.Tx], runChildDispatcherOver[*sql.Tx])
}

func runChildDispatcherOver[TTx any](driver drivertest.Driver[TTx]) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	schema := os.Getenv(childSchemaEnv)
	pool, err := pgxpool.New(ctx, os.Getenv(childURLEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	defer pool.Close()
	pid := os.Getpid()
	var provider outbox.Provider = outbox.ProviderFunc(func(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
		_, err := pool.Exec(ctx, `INSERT INTO "`+schema+`".ledger (key, pid) VALUES ($1, $2)`, string(req.Key), pid)
		if err != nil {
			return nil, err
		}
		return json.RawMessage(fmt.Sprintf(`{"pid":%d}`, pid)), nil
	})
	config := dispatcher.Config{PollInterval: 50 * time.Millisecond, BatchSize: 50, Concurrency: 8}
	if url := os.Getenv(childFlowURLEnv); url != "" {
		// The flow-control tests' provider: an HTTP API in the test
		// process, which counts the calls it runs at once itself.
		p, err := httpprovider.New(httpprovider.Config{URL: url})
		if err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			return 1
		}
		provider = p
		config = dispatcher.Config{PollInterval: 100 * time.Millisecond, BatchSize: 100, Concurrency: 100}
	}
	registry := outbox.NewRegistry()
	if err := registry.Register("refund", provider, outbox.IdempotentByKey); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	clientConfig := outbox.Config{Schema: schema, Registry: registry}
	if os.Getenv(childMaintenanceEnv) != "" {
		clientConfig.WorkerID = fmt.Sprintf("child-%d", pid)
		config.MaintenanceInterval = 100 * time.Millisecond
		config.Reconcile.Grace = time.Millisecond
	}
	client, closeClient, err := driver.Open(pool, clientConfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	defer closeClient()
	d, err := dispatcher.New(client, config)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	if err := d.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	return 0
}

func TestProcessesDrainEachRowOnce(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testProcessesDrainEachRowOnce[pgx.Tx], testProcessesDrainEachRowOnce[*sql.Tx])
}

func testProcessesDrainEachRowOnce[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()
	bundle := setup(t, driver)
	pool := pgoncetest.Pool(t)
	_, err := pool.Exec(t.Context(), `CREATE TABLE "`+bundle.schema+`".ledger (key text NOT NULL, pid integer NOT NULL)`)
	require.NoError(t, err)

	const rows = 3000
	bundle.submitAll(t, bundle.client, callsFrom("refund", 0, rows))

	children := make([]*exec.Cmd, 3)
	for i := range children {
		cmd := exec.Command(os.Args[0], "-test.run=^$") //nolint:gosec // the test binary itself
		cmd.Env = append(os.Environ(), childSchemaEnv+"="+bundle.schema, childURLEnv+"="+driver.URL(t),
			childDriverEnv+"="+driver.Name)
		cmd.Stderr = os.Stderr
		require.NoError(t, cmd.Start())
		children[i] = cmd
	}
	t.Cleanup(func() {
		for _, cmd := range children {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})

	require.Eventually(t, func() bool {
		var open int
		err := pool.QueryRow(context.Background(),
			`SELECT count(*) FROM "`+bundle.schema+`".pgonce_key WHERE state <> 'succeeded'`).Scan(&open)
		return err == nil && open == 0
	}, 3*time.Minute, 20*time.Millisecond)

	// Stop them gracefully: each drains and exits 0.
	for _, cmd := range children {
		require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	}
	for _, cmd := range children {
		require.NoError(t, cmd.Wait())
	}

	var effects, distinctKeys, workers int
	require.NoError(t, pool.QueryRow(t.Context(),
		`SELECT count(*), count(DISTINCT key), count(DISTINCT pid) FROM "`+bundle.schema+`".ledger`).
		Scan(&effects, &distinctKeys, &workers))
	require.Equal(t, rows, effects, "every row executed exactly once")
	require.Equal(t, rows, distinctKeys)
	require.GreaterOrEqual(t, workers, 2, "the processes shared the work")
}

func TestProcessesKilledLeaderIsReplaced(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testProcessesKilledLeaderIsReplaced[pgx.Tx], testProcessesKilledLeaderIsReplaced[*sql.Tx])
}

// testProcessesKilledLeaderIsReplaced runs two dispatcher processes with
// maintenance on: one is elected; SIGKILLed, it never resigns, and the
// other takes over once its lease expires and resolves a key that a crashed
// worker left in flight, with no reconciler but theirs.
func testProcessesKilledLeaderIsReplaced[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()
	bundle := setup(t, driver)
	pool := pgoncetest.Pool(t)
	_, err := pool.Exec(t.Context(), `CREATE TABLE "`+bundle.schema+`".ledger (key text NOT NULL, pid integer NOT NULL)`)
	require.NoError(t, err)

	// A key a crashed worker holds under a lease that ends in 3s: nobody
	// may take it before then.
	stranded := submit(t, bundle.client, "refund", 1)
	pgoncetest.AbandonKeys(t, bundle.schema, -3*time.Second, stranded)

	children := map[int]*exec.Cmd{}
	for range 2 {
		cmd := exec.Command(os.Args[0], "-test.run=^$") //nolint:gosec // the test binary itself
		cmd.Env = append(os.Environ(), childSchemaEnv+"="+bundle.schema, childURLEnv+"="+driver.URL(t),
			childDriverEnv+"="+driver.Name, childMaintenanceEnv+"=1")
		cmd.Stderr = os.Stderr
		require.NoError(t, cmd.Start())
		children[cmd.Process.Pid] = cmd
	}
	t.Cleanup(func() {
		for _, cmd := range children {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	leaderPID := func(l leader) int {
		var pid int
		_, err := fmt.Sscanf(l.id, "child-%d:", &pid)
		require.NoError(t, err, "leader id %q", l.id)
		return pid
	}

	var first leader
	require.Eventually(t, func() bool {
		got := leaders(t, bundle.schema)
		if len(got) == 1 {
			first = got[0]
		}
		return len(got) == 1
	}, time.Minute, 5*time.Millisecond, "nobody was elected")
	killed := leaderPID(first)
	require.Contains(t, children, killed)
	require.NoError(t, children[killed].Process.Kill())
	_ = children[killed].Wait()

	// The killed leader's lease lasts at least as long as it did when it
	// was read; nobody takes over before it expires.
	var next leader
	require.Eventually(t, func() bool {
		got := leaders(t, bundle.schema)
		if len(got) == 1 && leaderPID(got[0]) != killed {
			next = got[0]
			return true
		}
		return false
	}, time.Minute, 5*time.Millisecond, "the surviving process never took over")
	require.Contains(t, children, leaderPID(next))
	require.False(t, next.electedAt.Before(first.expiresAt), "taken over only once the killed leader's lease expired")

	// Abandoned at 1, reclaimed by maintenance at 2, dispatched at 3, or
	// later: on a busy machine the killed process may have claimed it
	// first, and the tool honours keys, so it is retried by key once that
	// claim's lease ends. Hence effects are counted by key: the provider
	// acted on the stranded key, and on no other.
	res := awaitState(t, bundle.client, stranded, outbox.StateSucceeded)
	require.GreaterOrEqual(t, res.Attempts, 3, "abandoned at 1, reclaimed by maintenance at 2, dispatched at 3 or later")
	var actedOn []string
	rows, err := pool.Query(t.Context(), `SELECT DISTINCT key FROM "`+bundle.schema+`".ledger`)
	require.NoError(t, err)
	actedOn, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{string(stranded)}, actedOn)
}

func TestProcessLogsNothingInASteadyStateByDefault(t *testing.T) {
	t.Parallel()
	// The default logger is the client's, whatever the driver: one suffices.
	testProcessLogsNothingInASteadyStateByDefault(t, drivertest.Pgx())
}

// testProcessLogsNothingInASteadyStateByDefault runs a dispatcher process
// with maintenance on and no Logger anywhere, through an election, a call
// and a graceful stop: the process's log (slog's default, on stderr) holds
// nothing, as a library that was not asked to talk should leave it.
func testProcessLogsNothingInASteadyStateByDefault[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()
	bundle := setup(t, driver)
	_, err := pgoncetest.Pool(t).Exec(t.Context(), `CREATE TABLE "`+bundle.schema+`".ledger (key text NOT NULL, pid integer NOT NULL)`)
	require.NoError(t, err)

	var stderr bytes.Buffer
	cmd := exec.Command(os.Args[0], "-test.run=^$") //nolint:gosec // the test binary itself
	cmd.Env = append(os.Environ(), childSchemaEnv+"="+bundle.schema, childURLEnv+"="+driver.URL(t),
		childDriverEnv+"="+driver.Name, childMaintenanceEnv+"=1")
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})

	awaitLeader(t, bundle.schema, fmt.Sprintf("child-%d", cmd.Process.Pid))
	awaitState(t, bundle.client, submit(t, bundle.client, "refund", 1), outbox.StateSucceeded)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait(), "stderr: %s", &stderr)
	require.Empty(t, stderr.String(), "a dispatcher without a Logger logs nothing below a warning")
}
