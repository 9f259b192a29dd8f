package httpprovider_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/httpprovider"
	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/reconcile"
)

// The environment of a dispatcher process of the process test.
const (
	childSchemaEnv = "PGONCE_TEST_HTTP_CHILD_SCHEMA"
	childURLEnv    = "PGONCE_TEST_HTTP_CHILD_URL"
	childDriverEnv = "PGONCE_TEST_HTTP_CHILD_DRIVER"
	childAPIEnv    = "PGONCE_TEST_HTTP_CHILD_API"
)

// childWorkerPrefix starts the worker id of a dispatcher process, followed
// by its pid.
const childWorkerPrefix = "httpchild-"

// processRegistry registers refund with a provider for the fake API at
// apiURL, as every process of the process test does.
func processRegistry(apiURL string) (*outbox.Registry, error) {
	p, err := httpprovider.New(httpprovider.Config{
		URL:          apiURL + "/v1/refunds",
		KeepHeaders:  []string{"Request-Id"},
		Timeout:      time.Second,
		KeyRetention: 24 * time.Hour,
	})
	if err != nil {
		return nil, err
	}
	registry := outbox.NewRegistry()
	return registry, p.Register(registry, "refund")
}

// processClientConfig is the client configuration of every process of the
// process test: a short lease, so that the leases of killed processes
// expire within the test.
func processClientConfig(schema string, registry *outbox.Registry) outbox.Config {
	return outbox.Config{Schema: schema, Registry: registry, Logger: quiet, CallTimeout: time.Second, Lease: 2 * time.Second}
}

// processDispatcherConfig is the dispatcher configuration of every process
// of the process test. Maintenance is off: the test's own reconciler
// resolves what the killed processes left.
func processDispatcherConfig() dispatcher.Config {
	return dispatcher.Config{
		Concurrency:         4,
		BatchSize:           8,
		PollInterval:        20 * time.Millisecond,
		BackoffFunc:         func(int) time.Duration { return 10 * time.Millisecond },
		MaxAttempts:         1000,
		MaintenanceDisabled: true,
	}
}

// runChildDispatcher is the body of a dispatcher process of the process
// test, over the driver its environment names: it sends refunds to the
// fake API at the URL its environment names, until it is killed or
// signalled.
func runChildDispatcher() int {
	return drivertest.RunChild(os.Getenv(childDriverEnv), runChildDispatcherOver[pgx.Tx], runChildDispatcherOver[*sql.Tx])
}

func runChildDispatcherOver[TTx any](driver drivertest.Driver[TTx]) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	err := func() error {
		pool, err := pgxpool.New(ctx, os.Getenv(childURLEnv))
		if err != nil {
			return err
		}
		defer pool.Close()
		registry, err := processRegistry(os.Getenv(childAPIEnv))
		if err != nil {
			return err
		}
		config := processClientConfig(os.Getenv(childSchemaEnv), registry)
		config.WorkerID = fmt.Sprintf("%s%d", childWorkerPrefix, os.Getpid())
		client, closeClient, err := driver.Open(pool, config)
		if err != nil {
			return err
		}
		defer closeClient()
		d, err := dispatcher.New(client, processDispatcherConfig())
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

// TestKilledProcessesAgainstAKeyedAPI runs refunds through two dispatcher
// processes to the fake payment API, which drops connections after
// acting, answers 500 after acting, rate-limits with 429 and Retry-After,
// declines, and holds every request of some keys after acting on the
// first. Once each held key has a request of the processes in flight at
// the API, the processes are SIGKILLed: no shutdown, no outcome recorded,
// their leases left to expire. A fresh dispatcher and the reconciler
// finish: every action has exactly one effect at the API, and every key
// ends with the API's own answer.
func TestKilledProcessesAgainstAKeyedAPI(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testKilledProcesses[pgx.Tx], testKilledProcesses[*sql.Tx])
}

func testKilledProcesses[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()
	ctx := t.Context()
	fake := newFakeProvider(t)
	registry, err := processRegistry(fake.server.URL)
	require.NoError(t, err)
	schema := pgoncetest.Schema(t)
	client := driver.Client(t, processClientConfig(schema, registry))

	// The held keys come in the first half, so that the kill comes with
	// work left.
	faults := []string{
		faultNone, faultDrop, fault500, fault429, faultDeclined, faultNone,
		faultNone, faultDrop, faultNone, fault500, faultNone, faultNone,
	}
	var calls []outbox.Call
	var actions []action
	holds := 0
	for i := range 48 {
		a := action{order: 2000 + i, fault: faults[i%len(faults)]}
		if i%6 == 5 && i < 24 {
			a.fault = faultHold
			holds++
		}
		actions = append(actions, a)
		calls = append(calls, outbox.Call{
			RunID: "run-3", Step: int64(i), Tool: "refund",
			Args: map[string]any{"order": a.order, "amount": 42, "fault": a.fault},
		})
	}
	keys := driver.SubmitKeys(t, client, calls)

	children := make([]*exec.Cmd, 2)
	for i := range children {
		cmd := exec.Command(os.Args[0], "-test.run=^$") //nolint:gosec // the test binary itself
		cmd.Env = append(os.Environ(), childSchemaEnv+"="+schema, childURLEnv+"="+pgoncetest.DatabaseURL(t),
			childDriverEnv+"="+driver.Name, childAPIEnv+"="+fake.server.URL)
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

	// Mid-load: every held key has a call of the processes in flight at the
	// API, which acted on it. Kill them there.
	requireEventually(t, func() bool { return fake.liveHeld() == holds }, "the processes had every held key in flight")
	for _, cmd := range children {
		require.NoError(t, cmd.Process.Kill())
	}
	for _, cmd := range children {
		err := cmd.Wait()
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit)
		status, ok := exit.Sys().(syscall.WaitStatus)
		require.True(t, ok)
		require.True(t, status.Signaled(), "killed, not exited: %v", err)
	}
	effectsAtKill := fake.totalEffects()
	require.GreaterOrEqual(t, effectsAtKill, holds, "the API acted on every held key before the kill")
	var leftInFlight, leftOpen int
	require.NoError(t, pgoncetest.Pool(t).QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE lease_until IS NOT NULL AND worker LIKE $1), count(*)
		FROM `+ident.Quote(schema)+`.pgonce_key WHERE state = 'open'`, childWorkerPrefix+"%").
		Scan(&leftInFlight, &leftOpen))
	require.Positive(t, leftInFlight, "the killed processes left keys in flight under their leases")
	t.Logf("at the kill: %d effects at the API, %d keys open, %d of them in flight under a killed process's lease",
		effectsAtKill, leftOpen, leftInFlight)

	// A fresh dispatcher and the reconciler finish; the held answers go
	// once the processes are gone.
	fake.releaseSlow()
	var wg sync.WaitGroup
	runCtx, stop := context.WithCancel(ctx)
	d, err := dispatcher.New(client, processDispatcherConfig())
	require.NoError(t, err)
	wg.Go(func() { _ = d.Run(runCtx) })
	rec, err := reconcile.New(client, reconcile.Config{Grace: time.Millisecond})
	require.NoError(t, err)
	wg.Go(func() { _ = rec.Run(runCtx, 50*time.Millisecond) })
	t.Cleanup(func() { stop(); wg.Wait() })

	declined := 0
	for i, key := range keys {
		waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
		res, err := client.Wait(waitCtx, key)
		cancel()
		a := actions[i]
		require.NoError(t, err, "order %d (%s)", a.order, a.fault)
		status, answer, reqID := fake.answerOf(string(key))
		if a.fault == faultDeclined {
			declined++
			require.Equal(t, outbox.StateFailed, res.State, "order %d", a.order)
			require.Equal(t, 0, fake.effectsOf(string(key)), "order %d", a.order)
			stored, err := httpprovider.Decode(res.Failure)
			require.NoError(t, err)
			require.Equal(t, http.StatusPaymentRequired, stored.Status)
			require.Equal(t, string(answer), string(stored.Body), "the API's failure, verbatim")
			continue
		}
		require.Equal(t, outbox.StateSucceeded, res.State, "order %d (%s)", a.order, a.fault)
		require.Equal(t, 1, fake.effectsOf(string(key)), "order %d (%s): one effect", a.order, a.fault)
		stored, err := httpprovider.Decode(res.Response)
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, status)
		require.Equal(t, status, stored.Status)
		require.Equal(t, string(answer), string(stored.Body), "order %d (%s): the API's answer, verbatim", a.order, a.fault)
		require.Equal(t, reqID, stored.Header.Get("Request-Id"))
	}
	require.Equal(t, len(actions)-declined, fake.totalEffects(), "one effect per action that was not declined, none else")
	pgoncetest.RequireKeyInvariants(t, schema)
}
