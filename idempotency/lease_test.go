package idempotency_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
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

	"github.com/pgonce/pgonce/dispatcher"
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
	// childDownstreamEnv, when set, is the URL of the keyed downstream API
	// that the killed server's keyed route calls before it blocks.
	childDownstreamEnv = "PGONCE_IDEMPOTENCY_CHILD_DOWNSTREAM"
)

// keyedTool is the tool of the tests' routes whose handler passes the key
// downstream.
const keyedTool = "keyed_request"

// newRouteRegistry returns a registry with the tests' two route tools:
// [idempotency.ToolDefault], at most once, and keyedTool, by key.
func newRouteRegistry() (*outbox.Registry, error) {
	registry := outbox.NewRegistry()
	if err := idempotency.Register(registry, idempotency.ToolDefault, outbox.AtMostOnce, nil); err != nil {
		return nil, err
	}
	if err := idempotency.Register(registry, keyedTool, outbox.IdempotentByKey, nil); err != nil {
		return nil, err
	}
	return registry, nil
}

func routeRegistry(t *testing.T) *outbox.Registry {
	t.Helper()
	registry, err := newRouteRegistry()
	require.NoError(t, err)
	return registry
}

// leaseHandler wraps handler in a lease-mode middleware of client whose
// keys are claimed under tool.
func leaseHandler[TTx any](t *testing.T, client *outbox.Client[TTx], tool string, handler http.Handler) http.Handler {
	t.Helper()
	h, err := wrap(client, idempotency.Config{Mode: idempotency.ModeLease, ScopeFunc: accountScope, Tool: tool}, handler)
	require.NoError(t, err)
	return h
}

// keyedAPI is a downstream API that deduplicates on Idempotency-Key, as
// payment APIs do: the first request of a key acts, once, and its answer is
// kept; every later request of the key gets that answer again.
type keyedAPI struct {
	mu       sync.Mutex
	answers  map[string]string // by key: one per effect
	requests int
}

func (a *keyedAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	a.mu.Lock()
	a.requests++
	answer, ok := a.answers[key]
	if !ok {
		answer = fmt.Sprintf(`{"id":"re_%d"}`, len(a.answers)+1)
		a.answers[key] = answer
	}
	a.mu.Unlock()
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write([]byte(answer))
}

// seen reports whether the API received key.
func (a *keyedAPI) seen(key string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.answers[key]
	return ok
}

// counts returns how many requests the API received, and how many effects
// it made.
func (a *keyedAPI) counts() (requests, effects int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.requests, len(a.answers)
}

// passKeyDownstream is a handler that calls the API at url with the
// request's key ([idempotency.Key]) and body, calls then, and answers with
// the API's answer.
func passKeyDownstream(url string, then func()) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, ok := idempotency.Key(r.Context())
		if !ok {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		req, err := http.NewRequestWithContext(r.Context(), http.MethodPost, url, r.Body)
		if err != nil {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		req.Header.Set("Idempotency-Key", string(key))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		defer func() { _ = resp.Body.Close() }()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		then()
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(body)
	})
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
		client := driver.Client(t, outbox.Config{Schema: pgoncetest.Schema(t), Registry: routeRegistry(t)})
		var runs atomic.Int64
		server := httptest.NewServer(leaseHandler(t, client, idempotency.ToolDefault, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
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

	t.Run("KeyedRoutePassesItsKeyAndRunsAgainAfterAServerError", func(t *testing.T) {
		t.Parallel()
		client := driver.Client(t, outbox.Config{Schema: pgoncetest.Schema(t), Registry: routeRegistry(t)})
		api := &keyedAPI{answers: map[string]string{}}
		downstream := httptest.NewServer(api)
		t.Cleanup(downstream.Close)
		var runs atomic.Int64
		keyed := passKeyDownstream(downstream.URL, func() {})
		server := httptest.NewServer(leaseHandler(t, client, keyedTool, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if runs.Add(1) == 1 {
				// The API acted; then this handler failed.
				keyed.ServeHTTP(httptest.NewRecorder(), r)
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write([]byte(`{"error":"try again"}`))
				return
			}
			keyed.ServeHTTP(w, r)
		})))
		t.Cleanup(server.Close)
		b := &testBundle{server: server}

		failed := b.post(t, "k-1", "acct_1", `{"amount": 1}`)
		require.Equal(t, http.StatusServiceUnavailable, failed.status)
		require.JSONEq(t, `{"error":"try again"}`, failed.body, "the handler's own answer")
		listed, err := client.List(t.Context(), outbox.ListParams{})
		require.NoError(t, err)
		require.Len(t, listed.Keys, 1)
		key := listed.Keys[0].Key
		res, err := client.Get(t.Context(), key)
		require.NoError(t, err)
		require.Equal(t, outbox.StatePending, res.State, "a server error is no outcome")

		retry := b.post(t, "k-1", "acct_1", `{"amount": 1}`)
		require.Equal(t, http.StatusCreated, retry.status)
		require.JSONEq(t, `{"id":"re_1"}`, retry.body)
		require.Empty(t, retry.header.Get(idempotency.ReplayedHeader))
		replay := b.post(t, "k-1", "acct_1", `{"amount": 1}`)
		require.Equal(t, retry.body, replay.body)
		require.Equal(t, "true", replay.header.Get(idempotency.ReplayedHeader))
		require.Equal(t, int64(2), runs.Load())
		requests, effects := api.counts()
		require.Equal(t, 2, requests)
		require.Equal(t, 1, effects)
		require.True(t, api.seen(string(key)), "the store's key is the one passed downstream")
	})

	t.Run("AtMostOnceRouteStoresAServerError", func(t *testing.T) {
		t.Parallel()
		client := driver.Client(t, outbox.Config{Schema: pgoncetest.Schema(t), Registry: routeRegistry(t)})
		var runs atomic.Int64
		server := httptest.NewServer(leaseHandler(t, client, idempotency.ToolDefault, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			runs.Add(1)
			w.WriteHeader(http.StatusBadGateway) // the outside world may have acted
		})))
		t.Cleanup(server.Close)
		b := &testBundle{server: server}
		require.Equal(t, http.StatusBadGateway, b.post(t, "k-1", "acct_1", `{}`).status)
		replay := b.post(t, "k-1", "acct_1", `{}`)
		require.Equal(t, http.StatusBadGateway, replay.status)
		require.Equal(t, "true", replay.header.Get(idempotency.ReplayedHeader))
		require.Equal(t, int64(1), runs.Load())
	})

	t.Run("PanicGoesToReviewAndNeverRunsAgain", func(t *testing.T) {
		t.Parallel()
		logger, _ := pgoncetest.CaptureLogs()
		client := driver.Client(t, outbox.Config{Schema: pgoncetest.Schema(t), Registry: routeRegistry(t), Logger: logger})
		var runs atomic.Int64
		server := httptest.NewServer(leaseHandler(t, client, idempotency.ToolDefault, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
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
	killMidRequest(t, driver, schema, "")
	client := driver.Client(t, childConfig(schema, routeRegistry(t)))
	key := abandonedKey(t, client)

	// The restarted service, whose registry the reconciler resolves by.
	var runs atomic.Int64
	server := httptest.NewServer(leaseHandler(t, client, idempotency.ToolDefault, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	})))
	t.Cleanup(server.Close)
	reconcileUntil(t, client, key, outbox.StateNeedsReview)

	retry := (&testBundle{server: server}).post(t, "k-1", "acct_1", `{"amount": 42}`)
	requireProblem(t, retry, http.StatusConflict, "needs-review")
	require.Equal(t, int64(0), runs.Load(), "nothing runs again")
}

// TestLeaseModeKeyedRouteServerKilledMidRequest kills, with SIGKILL, a
// separate process serving a lease-mode route registered
// [outbox.IdempotentByKey], after its handler passed the key to a
// downstream API that deduplicates on it and before it answered. Once the
// lease expires the reconciler puts the key back to pending, and the
// retried request runs the handler again: the API answers it from its
// memory of the key, one effect in all. A dispatcher runs beside it the
// whole time and never claims the requeued key.
func TestLeaseModeKeyedRouteServerKilledMidRequest(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testKilledKeyed, testKilledKeyed)
}

func testKilledKeyed[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()
	schema := pgoncetest.Schema(t)
	api := &keyedAPI{answers: map[string]string{}}
	downstream := httptest.NewServer(api)
	t.Cleanup(downstream.Close)
	killMidRequest(t, driver, schema, downstream.URL)
	requests, effects := api.counts()
	require.Equal(t, 1, requests, "the killed handler called the API")
	require.Equal(t, 1, effects)

	client := driver.Client(t, childConfig(schema, routeRegistry(t)))
	key := abandonedKey(t, client)

	// The restarted service, with a dispatcher of the same registry.
	var runs atomic.Int64
	server := httptest.NewServer(leaseHandler(t, client, keyedTool, passKeyDownstream(downstream.URL, func() { runs.Add(1) })))
	t.Cleanup(server.Close)
	d, err := dispatcher.New(client, dispatcher.Config{PollInterval: 20 * time.Millisecond, MaintenanceDisabled: true})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		require.NoError(t, <-done)
	})
	reconcileUntil(t, client, key, outbox.StatePending)

	b := &testBundle{server: server}
	retry := b.post(t, "k-1", "acct_1", `{"amount": 42}`)
	require.Equal(t, http.StatusCreated, retry.status, retry.body)
	require.JSONEq(t, `{"id":"re_1"}`, retry.body, "the API's answer to the abandoned request")
	require.Empty(t, retry.header.Get(idempotency.ReplayedHeader), "the handler ran for this request")
	require.Equal(t, int64(1), runs.Load())
	requests, effects = api.counts()
	require.Equal(t, 2, requests)
	require.Equal(t, 1, effects, "one effect downstream")

	res, err := client.Get(t.Context(), key)
	require.NoError(t, err)
	require.Equal(t, outbox.StateSucceeded, res.State)
	replay := b.post(t, "k-1", "acct_1", `{"amount": 42}`)
	require.Equal(t, retry.body, replay.body)
	require.Equal(t, "true", replay.header.Get(idempotency.ReplayedHeader))
	require.Equal(t, int64(1), runs.Load())
}

// killMidRequest starts a server process over schema, sends it a request
// with key k-1, and kills it, with SIGKILL, while the handler runs. With
// downstream, the route is keyedTool's, and its handler has passed the key
// to the API there; without, ToolDefault's.
func killMidRequest[TTx any](t *testing.T, driver drivertest.Driver[TTx], schema, downstream string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$") //nolint:gosec // the test binary itself
	cmd.Env = append(os.Environ(), childSchemaEnv+"="+schema, childURLEnv+"="+pgoncetest.DatabaseURL(t),
		childDriverEnv+"="+driver.Name, childDownstreamEnv+"="+downstream)
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
}

// abandonedKey returns the one key of client's schema, which the killed
// server left in flight.
func abandonedKey[TTx any](t *testing.T, client *outbox.Client[TTx]) outbox.Key {
	t.Helper()
	listed, err := client.List(t.Context(), outbox.ListParams{})
	require.NoError(t, err)
	require.Len(t, listed.Keys, 1)
	key := listed.Keys[0].Key
	res, err := client.Get(t.Context(), key)
	require.NoError(t, err)
	require.Equal(t, outbox.StateInFlight, res.State, "the killed server left the key in flight")
	return key
}

// reconcileUntil runs the reconciler of client until key is in state want.
func reconcileUntil[TTx any](t *testing.T, client *outbox.Client[TTx], key outbox.Key, want outbox.State) {
	t.Helper()
	rec, err := reconcile.New(client, reconcile.Config{Grace: time.Millisecond})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, err := rec.RunOnce(t.Context())
		res, getErr := client.Get(t.Context(), key)
		return err == nil && getErr == nil && res.State == want
	}, 30*time.Second, 100*time.Millisecond)
}

// childConfig is the client config of the killed server and of the test
// that inspects what it left: a short lease, so that it expires soon.
func childConfig(schema string, registry *outbox.Registry) outbox.Config {
	return outbox.Config{Schema: schema, Registry: registry, CallTimeout: time.Second, Lease: 2 * time.Second}
}

// runChildServer serves a lease-mode route whose handler says "running" on
// stdout and then blocks until the process is killed: keyedTool's route,
// whose handler first passes the key downstream, when childDownstreamEnv
// is set; else ToolDefault's.
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
	registry, err := newRouteRegistry()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	client, closeFunc, err := driver.Open(pool, childConfig(os.Getenv(childSchemaEnv), registry))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer closeFunc()
	block := func() {
		fmt.Println("running")
		select {} // until killed
	}
	config := idempotency.Config{Mode: idempotency.ModeLease, ScopeFunc: accountScope}
	var route http.Handler = http.HandlerFunc(func(http.ResponseWriter, *http.Request) { block() })
	if downstream := os.Getenv(childDownstreamEnv); downstream != "" {
		config.Tool, route = keyedTool, passKeyDownstream(downstream, block)
	}
	handler, err := wrap(client, config, route)
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
