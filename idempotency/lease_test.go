package idempotency_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/idempotency"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/reconcile"
)

const (
	childSchemaEnv = "PGONCE_IDEMPOTENCY_CHILD_SCHEMA"
	childURLEnv    = "PGONCE_IDEMPOTENCY_CHILD_URL"
	childDriverEnv = "PGONCE_IDEMPOTENCY_CHILD_DRIVER"
)

// leaseHandler wraps handler in a lease-mode middleware of client.
func leaseHandler[TTx any](t *testing.T, client *outbox.Client[TTx], handler http.Handler) http.Handler {
	t.Helper()
	h, err := wrap(client, idempotency.Config{Mode: idempotency.ModeLease, ScopeFunc: accountScope}, handler)
	require.NoError(t, err)
	return h
}

func accountScope(r *http.Request) (string, error) { return r.Header.Get("Account"), nil }

// wrap builds the middleware of client's driver around handler.
func wrap[TTx any](client *outbox.Client[TTx], config idempotency.Config, handler http.Handler) (http.Handler, error) {
	switch c := any(client).(type) {
	case *outbox.Client[pgx.Tx]:
		m, err := idempotency.NewPgx(nil, c, config)
		if err != nil {
			return nil, err
		}
		return m.Handler(handler), nil
	case *outbox.Client[*sql.Tx]:
		m, err := idempotency.New(nil, c, config)
		if err != nil {
			return nil, err
		}
		return m.Handler(handler), nil
	}
	return nil, fmt.Errorf("no driver for %T", client)
}

func TestLeaseMode(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testLeaseMode, testLeaseMode)
}

func testLeaseMode[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()

	t.Run("ConcurrentDuplicatesRunTheHandlerOnceThenReplay", func(t *testing.T) {
		t.Parallel()
		client := driver.Client(t, outbox.Config{Schema: pgoncetest.Schema(t), Registry: outbox.NewRegistry()})
		var runs atomic.Int64
		server := httptest.NewServer(leaseHandler(t, client, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			n := runs.Add(1)
			w.WriteHeader(http.StatusCreated)
			_, _ = fmt.Fprintf(w, "{\"run\": %d}\n", n)
		})))
		t.Cleanup(server.Close)
		b := &testBundle{server: server}
		answers := make([]answer, 16)
		var wg sync.WaitGroup
		for i := range answers {
			wg.Go(func() { answers[i], _ = b.send(t.Context(), "k-1", "acct_1", `{"amount": 1}`) })
		}
		wg.Wait()
		require.Equal(t, int64(1), runs.Load())
		for _, a := range answers {
			if a.status == http.StatusConflict {
				require.NotEmpty(t, a.header.Get("Retry-After"))
				continue
			}
			require.Equal(t, http.StatusCreated, a.status)
			require.Equal(t, "{\"run\": 1}\n", a.body)
		}
		replay := b.post(t, "k-1", "acct_1", `{"amount": 1}`)
		require.Equal(t, "{\"run\": 1}\n", replay.body)
		require.Equal(t, "true", replay.header.Get(idempotency.ReplayedHeader))
		requireProblem(t, b.post(t, "k-1", "acct_1", `{"amount": 2}`), http.StatusUnprocessableEntity, "key-reused")
	})

	t.Run("PanicGoesToReviewAndNeverRunsAgain", func(t *testing.T) {
		t.Parallel()
		logger, _ := pgoncetest.CaptureLogs()
		client := driver.Client(t, outbox.Config{Schema: pgoncetest.Schema(t), Registry: outbox.NewRegistry(), Logger: logger})
		var runs atomic.Int64
		server := httptest.NewServer(leaseHandler(t, client, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
			runs.Add(1)
			panic("the payment API call may have happened")
		})))
		t.Cleanup(server.Close)
		b := &testBundle{server: server}
		requireProblem(t, b.post(t, "k-1", "acct_1", `{}`), http.StatusConflict, "needs-review")
		requireProblem(t, b.post(t, "k-1", "acct_1", `{}`), http.StatusConflict, "needs-review")
		require.Equal(t, int64(1), runs.Load())
	})
}

// TestLeaseModeServerKilledMidRequest kills, with SIGKILL, a separate
// process serving a lease-mode route while its handler runs. The key stays
// in flight; once its lease expires the reconciler resolves it by the
// route's delivery (at most once: review), and a retry of the request gets
// 409 needs-review instead of a second run.
func TestLeaseModeServerKilledMidRequest(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testKilled, testKilled)
}

func testKilled[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()
	schema := pgoncetest.Schema(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$") //nolint:gosec // the test binary itself
	cmd.Env = append(os.Environ(), childSchemaEnv+"="+schema, childURLEnv+"="+pgoncetest.DatabaseURL(t), childDriverEnv+"="+driver.Name)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := bufio.NewScanner(stdout)
	require.True(t, lines.Scan())
	addr := strings.TrimPrefix(lines.Text(), "listening ")

	b := &testBundle{server: &httptest.Server{URL: "http://" + addr}}
	go func() { _, _ = b.send(context.WithoutCancel(t.Context()), "k-1", "acct_1", `{"amount": 42}`) }()
	require.True(t, lines.Scan())
	require.Equal(t, "running", lines.Text())
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()

	client := driver.Client(t, childConfig(schema))
	listed, err := client.List(t.Context(), outbox.ListParams{})
	require.NoError(t, err)
	require.Len(t, listed.Keys, 1)
	key := listed.Keys[0].Key
	res, err := client.Get(t.Context(), key)
	require.NoError(t, err)
	require.Equal(t, outbox.StateInFlight, res.State, "the killed server left the key in flight")

	// The restarted service: its middleware registers the route's tool,
	// which the reconciler resolves by.
	var runs atomic.Int64
	server := httptest.NewServer(leaseHandler(t, client, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	})))
	t.Cleanup(server.Close)
	rec, err := reconcile.New(client, reconcile.Config{Grace: time.Millisecond})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, err := rec.RunOnce(t.Context())
		res, getErr := client.Get(t.Context(), key)
		return err == nil && getErr == nil && res.State == outbox.StateNeedsReview
	}, 30*time.Second, 100*time.Millisecond)

	retry := (&testBundle{server: server}).post(t, "k-1", "acct_1", `{"amount": 42}`)
	requireProblem(t, retry, http.StatusConflict, "needs-review")
	require.Equal(t, int64(0), runs.Load(), "nothing runs again")
}

// childConfig is the client config of the killed server and of the test
// that inspects what it left: a short lease, so that it expires soon.
func childConfig(schema string) outbox.Config {
	return outbox.Config{Schema: schema, Registry: outbox.NewRegistry(), CallTimeout: time.Second, Lease: 2 * time.Second}
}

// runChildServer serves a lease-mode route whose handler says "running" on
// stdout and then blocks until the process is killed.
func runChildServer() int {
	return drivertest.RunChild(os.Getenv(childDriverEnv), childServe[pgx.Tx], childServe[*sql.Tx])
}

func childServe[TTx any](driver drivertest.Driver[TTx]) int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(childURLEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	client, closeFunc, err := driver.Open(pool, childConfig(os.Getenv(childSchemaEnv)))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer closeFunc()
	handler, err := wrap(client, idempotency.Config{Mode: idempotency.ModeLease, ScopeFunc: accountScope},
		http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
			fmt.Println("running")
			select {} // until killed
		}))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("listening " + listener.Addr().String())
	server := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	_ = server.Serve(listener)
	return 0
}
