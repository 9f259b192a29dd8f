package dispatcher_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/reconcile"
)

const (
	// presetChildSchemaEnv, when set, makes this test binary a service
	// under the development preset that crashes right after its refund
	// provider acted (see runPresetChild).
	presetChildSchemaEnv = "PGONCE_TEST_PRESET_CHILD_SCHEMA"
	presetChildURLEnv    = "PGONCE_TEST_PRESET_CHILD_URL"
	// presetCrashExit is the exit status of the crashing child.
	presetCrashExit = 3
)

// developmentPreset returns the client and dispatcher configurations of the
// development preset, as docs/examples.md ("Development preset") spells
// them.
func developmentPreset(schema string, registry *outbox.Registry) (outbox.Config, dispatcher.Config) {
	client := outbox.Config{
		Schema:      schema,
		Registry:    registry,
		CallTimeout: outbox.CallTimeoutDevelopment,
		Lease:       outbox.LeaseDevelopment,
		Logger:      slog.New(slog.DiscardHandler),
	}
	config := dispatcher.Config{
		MaintenanceInterval: dispatcher.MaintenanceIntervalDevelopment,
		Reconcile:           dispatcher.ReconcileConfig{Grace: reconcile.GraceDevelopment},
	}
	return client, config
}

// recoveryBound is the documented bound on the time from a crash to the
// resolution of the key the crashed worker held: its lease and the
// reconciler's grace must pass, and so must the crashed process's
// maintenance leadership (three intervals), and the next maintenance run
// comes at most one interval after both.
func recoveryBound(client outbox.Config, config dispatcher.Config) time.Duration {
	return max(client.Lease+config.Reconcile.Grace, 3*config.MaintenanceInterval) + config.MaintenanceInterval
}

// presetLedger is the refund provider of the development preset's tests:
// it records one refund per key in a ledger table, as a payment API that
// honours idempotency keys does, and returns its row.
func presetLedger(pool *pgxpool.Pool, table string) outbox.ProviderFunc {
	return func(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
		if _, err := pool.Exec(ctx, `INSERT INTO `+table+` (key, pid) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING`,
			string(req.Key), os.Getpid()); err != nil {
			return nil, err
		}
		var pid int
		if err := pool.QueryRow(ctx, `SELECT pid FROM `+table+` WHERE key = $1`, string(req.Key)).Scan(&pid); err != nil {
			return nil, err
		}
		return fmt.Appendf(nil, `{"refunded_by":%d}`, pid), nil
	}
}

// runPresetChild is a service under the development preset whose process
// dies right after its refund provider acted, before the outcome is
// recorded: no resignation, no record, its maintenance leadership left to
// expire.
func runPresetChild() int {
	ctx := context.Background()
	schema := os.Getenv(presetChildSchemaEnv)
	pool, err := pgxpool.New(ctx, os.Getenv(presetChildURLEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	acts := presetLedger(pool, ident.Quote(schema)+".ledger")
	registry := outbox.NewRegistry()
	crash := outbox.ProviderFunc(func(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
		if _, err := acts(ctx, req); err != nil {
			return nil, err
		}
		os.Exit(presetCrashExit)
		return nil, nil
	})
	if err := registry.Register("refund", crash, outbox.IdempotentByKey); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	clientConfig, config := developmentPreset(schema, registry)
	client, err := outbox.NewPgx(pool, clientConfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	d, err := dispatcher.New(client, config)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	err = d.Run(ctx) // until the provider ends the process
	fmt.Fprintln(os.Stderr, "child: the dispatcher returned:", err)
	return 1
}

// TestDevelopmentPreset shows the development preset's promise: a key that
// a crashed process left in flight, after its provider acted, is resolved
// within seconds by the dispatcher of the next process, with no reconciler
// of the service's own, and the provider acted once.
func TestDevelopmentPreset(t *testing.T) {
	t.Parallel()

	registry := outbox.NewRegistry()
	clientConfig, config := developmentPreset("unused", registry)
	bound := recoveryBound(clientConfig, config)
	require.Equal(t, 5*time.Second, bound, "the bound docs/examples.md states")
	defaults := recoveryBound(outbox.Config{Lease: outbox.CallTimeoutDefault + 30*time.Second},
		dispatcher.Config{MaintenanceInterval: dispatcher.MaintenanceIntervalDefault, Reconcile: dispatcher.ReconcileConfig{Grace: reconcile.GraceDefault}})
	require.Equal(t, 2*time.Minute, defaults, "the defaults' bound docs/examples.md states")
	requirePresetDocumented(t, bound, defaults)

	ctx := t.Context()
	schema := pgoncetest.Schema(t)
	pool := pgoncetest.Pool(t)
	ledger := ident.Quote(schema) + ".ledger"
	_, err := pool.Exec(ctx, `CREATE TABLE `+ledger+` (key text PRIMARY KEY, pid integer NOT NULL)`)
	require.NoError(t, err)
	require.NoError(t, registry.Register("refund", presetLedger(pool, ledger), outbox.IdempotentByKey))
	clientConfig, config = developmentPreset(schema, registry)
	client, err := outbox.NewPgx(pool, clientConfig)
	require.NoError(t, err)
	key := submit(t, client, "refund", 1)

	// The first process claims the key, refunds and dies.
	child := exec.Command(os.Args[0], "-test.run=^$") //nolint:gosec // the test binary itself
	child.Env = append(os.Environ(), presetChildSchemaEnv+"="+schema, presetChildURLEnv+"="+pgoncetest.DatabaseURL(t))
	child.Stderr = os.Stderr
	err = child.Run()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	require.Equal(t, presetCrashExit, exit.ExitCode(), "the child crashed in its provider")
	crashed := time.Now()
	res, err := client.Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, outbox.StateInFlight, res.State, "the crash left the key in flight")
	var refunds int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+ledger).Scan(&refunds))
	require.Equal(t, 1, refunds, "the child refunded before it crashed")

	// The next process: a dispatcher under the same preset.
	d, err := dispatcher.New(client, config)
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		require.NoError(t, <-done)
	})

	// Await the recovery. The timeout only stops a hung test: it is twelve
	// times the preset's bound, and still well under the two minutes the
	// defaults take, so that a preset that did not hold its promise fails.
	waitCtx, cancel := context.WithTimeout(ctx, 12*bound)
	defer cancel()
	res, err = client.Wait(waitCtx, key)
	require.NoError(t, err, "the crashed attempt was not recovered within %s", 12*bound)
	t.Logf("recovered %s after the crash (the preset's bound: %s)", time.Since(crashed).Round(time.Millisecond), bound)
	require.Equal(t, outbox.StateSucceeded, res.State)
	require.Equal(t, 3, res.Attempts, "crashed at 1, reclaimed by maintenance at 2, dispatched again at 3")
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+ledger).Scan(&refunds))
	require.Equal(t, 1, refunds, "the provider deduplicated the retry on the key")
	require.JSONEq(t, fmt.Sprintf(`{"refunded_by":%d}`, child.ProcessState.Pid()), string(res.Response))
}

// requirePresetDocumented checks the figures of docs/examples.md's
// "Development preset" against the constants, so that a changed preset
// cannot leave the page promising other times.
func requirePresetDocumented(t *testing.T, bound, defaults time.Duration) {
	t.Helper()
	page, err := os.ReadFile(filepath.Join("..", "docs", "examples.md"))
	require.NoError(t, err)
	_, section, found := strings.Cut(string(page), "\n## Development preset\n")
	require.True(t, found)
	section, _, _ = strings.Cut(section, "\n## ")
	section = strings.Join(strings.Fields(section), " ")
	seconds := func(d time.Duration) string { return fmt.Sprintf("%d s", int(d.Seconds())) }
	for _, want := range []string{
		"`outbox.CallTimeoutDevelopment`, " + seconds(outbox.CallTimeoutDevelopment) + " |",
		"`outbox.LeaseDevelopment`, " + seconds(outbox.LeaseDevelopment) + " |",
		"`reconcile.GraceDevelopment`, " + seconds(reconcile.GraceDevelopment) + " |",
		"`dispatcher.MaintenanceIntervalDevelopment`, " + seconds(dispatcher.MaintenanceIntervalDevelopment) + " |",
		fmt.Sprintf("| **%d min** | **%s** |", int(defaults.Minutes()), seconds(bound)),
		"max(Lease + Grace, 3 × MaintenanceInterval) + MaintenanceInterval",
	} {
		require.Contains(t, section, want)
	}
}
