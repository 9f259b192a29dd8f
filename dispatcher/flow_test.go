package dispatcher_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/httpprovider"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
)

// countingAPI is a downstream HTTP API that counts, itself, the calls it
// runs at once and the calls of each idempotency key, and may answer one
// call with a slow down.
type countingAPI struct {
	running, most atomic.Int64
	// hold is how long each call takes.
	hold time.Duration
	// slowDownAt, when positive, is the call (from 1) answered with a 429
	// and Retry-After of slowDownFor seconds.
	slowDownAt  int64
	slowDownFor int

	mu       sync.Mutex
	calls    int64
	keys     map[string]int
	arrivals []time.Time
	// slowedAt is when the 429 was sent.
	slowedAt time.Time
}

func newCountingAPI(hold time.Duration) *countingAPI {
	return &countingAPI{hold: hold, keys: map[string]int{}}
}

func (a *countingAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := a.running.Add(1)
	defer a.running.Add(-1)
	for most := a.most.Load(); now > most && !a.most.CompareAndSwap(most, now); most = a.most.Load() {
	}
	a.mu.Lock()
	a.calls++
	call := a.calls
	a.arrivals = append(a.arrivals, time.Now())
	if call == a.slowDownAt {
		a.slowedAt = time.Now()
		a.mu.Unlock()
		w.Header().Set("Retry-After", strconv.Itoa(a.slowDownFor))
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	a.keys[r.Header.Get(httpprovider.KeyHeaderDefault)]++
	a.mu.Unlock()
	// The call's own work: long enough for calls to overlap.
	time.Sleep(a.hold)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"ok":true}`))
}

// effects returns how many keys the API acted on, and the most times one
// key was acted on.
func (a *countingAPI) effects() (keys, most int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, n := range a.keys {
		most = max(most, n)
	}
	return len(a.keys), most
}

// flowCalls is how many calls the multi-process flow test drains:
// PGONCE_TEST_FLOW_CALLS, or 2,000.
func flowCalls(t *testing.T) int {
	t.Helper()
	if v := os.Getenv("PGONCE_TEST_FLOW_CALLS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err)
		return n
	}
	return 2000
}

func TestFlowMaxInFlightAcrossProcesses(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testFlowMaxInFlightAcrossProcesses[pgx.Tx], testFlowMaxInFlightAcrossProcesses[*sql.Tx])
}

// testFlowMaxInFlightAcrossProcesses runs three dispatcher processes of 100
// slots each against an API that counts its concurrent calls itself, with a
// limit of 25 in flight: the API never runs more than 25 at once, and every
// key acts once.
func testFlowMaxInFlightAcrossProcesses[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()
	bundle := setup(t, driver)
	api := newCountingAPI(2 * time.Millisecond)
	server := httptest.NewServer(api)
	t.Cleanup(server.Close)

	const limit = 25
	_, err := bundle.client.SetToolLimits(t.Context(), "refund", outbox.ToolLimits{MaxInFlight: limit},
		outbox.LimitParams{By: "test", Reason: "the provider takes 25 at once"})
	require.NoError(t, err)
	calls := flowCalls(t)
	bundle.submitAll(t, bundle.client, callsFrom("refund", 0, calls))

	children := make([]*exec.Cmd, 3)
	for i := range children {
		cmd := exec.Command(os.Args[0], "-test.run=^$") //nolint:gosec // the test binary itself
		cmd.Env = append(os.Environ(), childSchemaEnv+"="+bundle.schema, childURLEnv+"="+driver.URL(t),
			childDriverEnv+"="+driver.Name, childFlowURLEnv+"="+server.URL)
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

	pool := pgoncetest.Pool(t)
	require.Eventually(t, func() bool {
		var open int
		err := pool.QueryRow(context.Background(),
			`SELECT count(*) FROM "`+bundle.schema+`".pgonce_key WHERE state <> 'succeeded'`).Scan(&open)
		return err == nil && open == 0
	}, 10*time.Minute, 20*time.Millisecond)
	for _, cmd := range children {
		require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	}
	for _, cmd := range children {
		require.NoError(t, cmd.Wait())
	}

	keys, most := api.effects()
	require.Equal(t, calls, keys, "every key acted on")
	require.Equal(t, 1, most, "no key acted on twice")
	t.Logf("%d calls across 3 processes of 100 slots, each key acted on once; at most %d at once under a limit of %d",
		calls, api.most.Load(), limit)
	require.LessOrEqual(t, api.most.Load(), int64(limit), "the API never ran more calls at once than the limit")
	require.Greater(t, api.most.Load(), int64(1), "calls overlapped")
}

// flowRateWindow is how long the multi-process rate test keeps its tool
// busy: PGONCE_TEST_FLOW_RATE_SECONDS, or 10s. From 30s on (make
// flow-full) the test also measures the rate the API saw against the limit,
// within 5%.
func flowRateWindow(t *testing.T) time.Duration {
	t.Helper()
	if v := os.Getenv("PGONCE_TEST_FLOW_RATE_SECONDS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err)
		require.Positive(t, n)
		return time.Duration(n) * time.Second
	}
	return 10 * time.Second
}

func TestFlowRateAcrossProcesses(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testFlowRateAcrossProcesses[pgx.Tx], testFlowRateAcrossProcesses[*sql.Tx])
}

// testFlowRateAcrossProcesses runs three dispatcher processes of 100 slots
// each against an API that records when each call reached it, with a rate
// limit of 200 calls per second and a burst of 200, and a backlog of more
// than the window's worth. The bucket starts full when the limit is set, so
// by any time t the API can have seen at most burst + rate × (t - set)
// calls, whatever the processes and the machine's load: that is asserted of
// every call. Whether the dispatchers keep up with the rate depends on the
// machine; the long run (make flow-full) measures the window's calls
// against rate × window, within 5%.
func testFlowRateAcrossProcesses[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()
	bundle := setup(t, driver)
	api := newCountingAPI(2 * time.Millisecond)
	server := httptest.NewServer(api)
	t.Cleanup(server.Close)

	const (
		rate  = 200
		burst = 200
	)
	window := flowRateWindow(t)
	calls := int(rate*window.Seconds()*1.1) + burst
	bundle.submitAll(t, bundle.client, callsFrom("refund", 0, calls))
	set := time.Now()
	_, err := bundle.client.SetToolLimits(t.Context(), "refund", outbox.ToolLimits{Rate: rate, Burst: burst},
		outbox.LimitParams{By: "test", Reason: "the provider takes 200 calls a second"})
	require.NoError(t, err)

	children := make([]*exec.Cmd, 3)
	for i := range children {
		cmd := exec.Command(os.Args[0], "-test.run=^$") //nolint:gosec // the test binary itself
		cmd.Env = append(os.Environ(), childSchemaEnv+"="+bundle.schema, childURLEnv+"="+driver.URL(t),
			childDriverEnv+"="+driver.Name, childFlowURLEnv+"="+server.URL)
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

	pool := pgoncetest.Pool(t)
	require.Eventually(t, func() bool {
		var open int
		err := pool.QueryRow(context.Background(),
			`SELECT count(*) FROM "`+bundle.schema+`".pgonce_key WHERE state <> 'succeeded'`).Scan(&open)
		return err == nil && open == 0
	}, 30*time.Minute, 20*time.Millisecond)
	for _, cmd := range children {
		require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	}
	for _, cmd := range children {
		require.NoError(t, cmd.Wait())
	}

	keys, most := api.effects()
	require.Equal(t, calls, keys, "every key acted on")
	require.Equal(t, 1, most, "no key acted on twice")
	api.mu.Lock()
	arrivals := slices.Clone(api.arrivals)
	api.mu.Unlock()
	slices.SortFunc(arrivals, time.Time.Compare)
	for i, at := range arrivals {
		// One call of slack for the bucket's floating-point arithmetic.
		allowed := burst + rate*at.Sub(set).Seconds() + 1
		require.LessOrEqual(t, float64(i+1), allowed,
			"%d calls by %s after the limit was set: more than the burst and the rate allow", i+1, at.Sub(set))
	}

	first := arrivals[0]
	inWindow := 0
	for _, at := range arrivals {
		if at.Sub(first) < window {
			inWindow++
		}
	}
	want := rate * window.Seconds()
	t.Logf("rate %d/s, burst %d, 3 processes: %d calls in the %s after the first, %.1f%% of rate × window; all %d calls over %s",
		rate, burst, inWindow, window, 100*float64(inWindow)/want, len(arrivals), arrivals[len(arrivals)-1].Sub(first).Round(time.Millisecond))
	// Calls per second of the window, to tell a slow start from a slow
	// machine.
	perSecond := make([]int, int(window/time.Second))
	for _, at := range arrivals {
		if i := int(at.Sub(first) / time.Second); i < len(perSecond) {
			perSecond[i]++
		}
	}
	t.Logf("calls per second: %v", perSecond)
	if window >= 30*time.Second {
		require.InDelta(t, want, float64(inWindow), want*0.05, "the rate the API saw is within 5%% of the limit")
	}
}

func TestFlowSlowDown(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testFlowSlowDown[pgx.Tx], testFlowSlowDown[*sql.Tx])
}

func testFlowSlowDown[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()

	// dispatchers starts three dispatchers over their own clients, whose
	// refund tool posts to url.
	dispatchers := func(t *testing.T, bundle *testBundle[TTx], url string) {
		t.Helper()
		for range 3 {
			p, err := httpprovider.New(httpprovider.Config{URL: url})
			require.NoError(t, err)
			registry := outbox.NewRegistry()
			require.NoError(t, registry.Register("refund", p, outbox.IdempotentByKey))
			d, err := dispatcher.New(bundle.clientWith(t, registry), dispatcher.Config{
				PollInterval: 20 * time.Millisecond, Concurrency: 10, MaxAttempts: 1,
			})
			require.NoError(t, err)
			start(t, d)
		}
	}

	t.Run("NoCallUntilRetryAfterFromAnyDispatcher", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		api := newCountingAPI(0)
		api.slowDownAt, api.slowDownFor = 5, 2
		server := httptest.NewServer(api)
		t.Cleanup(server.Close)
		// One call at a time across the dispatchers: the call that is told
		// to slow down is the only one in flight, so every later call was
		// claimed after the slow down was recorded.
		_, err := bundle.client.SetToolLimits(t.Context(), "refund", outbox.ToolLimits{MaxInFlight: 1},
			outbox.LimitParams{By: "test", Reason: "one at a time"})
		require.NoError(t, err)
		keys := bundle.submitAll(t, bundle.client, callsFrom("refund", 0, 10))
		dispatchers(t, bundle, server.URL)

		for _, key := range keys {
			// MaxAttempts is 1: a key whose slow down spent its attempt
			// would fail.
			res := awaitState(t, bundle.client, key, outbox.StateSucceeded)
			require.Equal(t, 1, res.Attempts, "the slow down spent no attempt of key %s", key)
		}
		api.mu.Lock()
		defer api.mu.Unlock()
		require.Len(t, api.arrivals, 11, "ten calls and the one told to slow down")
		after := api.arrivals[api.slowDownAt]
		require.GreaterOrEqual(t, after.Sub(api.slowedAt), 2*time.Second,
			"no call within Retry-After of the 429")
	})

	t.Run("ToolWithoutControlIsSlowedDownAndNoKeyFails", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		api := newCountingAPI(time.Millisecond)
		api.slowDownAt, api.slowDownFor = 20, 1
		server := httptest.NewServer(api)
		t.Cleanup(server.Close)
		keys := bundle.submitAll(t, bundle.client, callsFrom("refund", 0, 200))
		dispatchers(t, bundle, server.URL)

		for _, key := range keys {
			res := awaitState(t, bundle.client, key, outbox.StateSucceeded)
			require.Equal(t, 1, res.Attempts, "the slow down spent no attempt of key %s", key)
		}
		got, most := api.effects()
		require.Equal(t, len(keys), got)
		require.Equal(t, 1, most)
		// The slow-down ended and the tool has no limit or pause: the
		// dispatchers' claims forget its row, and its keys are claimed by
		// the plain claim again.
		require.Eventually(t, func() bool {
			statuses, err := bundle.client.Tools(t.Context())
			return err == nil && len(statuses) == 0
		}, time.Minute, 5*time.Millisecond, "the tool's control row outlived its slow-down")
		more := bundle.submitAll(t, bundle.client, callsFrom("refund", 200, 20))
		for _, key := range more {
			awaitState(t, bundle.client, key, outbox.StateSucceeded)
		}
	})

	// endEarly slows refund down for an hour through its provider, ends the
	// slow-down with EndSlowDown, and checks that the key it held runs.
	// notify says whether the dispatcher listens: one that does not holds
	// the slowed-down tool until its next read of the tools' flow control,
	// every MaintenanceInterval (50ms here), not until the slow-down's end.
	endEarly := func(t *testing.T, notify bool) {
		t.Helper()
		bundle := setup(t, driver)
		var calls atomic.Int64
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
			if calls.Add(1) == 1 {
				return nil, outbox.SlowDown(errors.New("429 Too Many Requests"), time.Hour)
			}
			return json.RawMessage(`{"id":"re_1"}`), nil
		}), outbox.IdempotentByKey))
		client := bundle.clientWith(t, registry)
		key := submit(t, client, "refund", 1)
		maintenance := time.Hour // a notification tells the dispatcher
		if !notify {
			maintenance = 50 * time.Millisecond
		}
		pool, counter := countedPool(t, driver.URL(t))
		dispatched := driver.ClientOver(t, pool, outbox.Config{Schema: bundle.schema, Registry: registry, NotifyDisabled: !notify})
		d, err := dispatcher.New(dispatched, dispatcher.Config{
			PollInterval: 20 * time.Millisecond, MaxAttempts: 1, MaintenanceInterval: maintenance, MaintenanceDisabled: true,
		})
		require.NoError(t, err)
		start(t, d)
		var status outbox.ToolStatus
		require.Eventually(t, func() bool {
			status, err = client.Tool(t.Context(), "refund")
			require.NoError(t, err)
			return status.SlowedDown(time.Now())
		}, time.Minute, 5*time.Millisecond, "the provider's slow down was recorded")
		// A key submitted now is due, and waits for the slow-down: the
		// dispatcher's claim finds it so, and holds the tool.
		later := submit(t, client, "refund", 2)
		claims := counter.count("OutboxClaimControlled")
		require.Eventually(t, func() bool { return counter.count("OutboxClaimControlled") > claims },
			time.Minute, 5*time.Millisecond)

		// Neither a resume nor clearing the limits ends it.
		status, err = client.Resume(t.Context(), "refund", outbox.ResumeParams{By: "alice"})
		require.NoError(t, err)
		require.True(t, status.SlowedDown(time.Now()))
		// Without notifications the tool keeps a limit, and so its row
		// after the slow-down ends: the dispatcher's hold of the tool must
		// end with its next read, not at the slow-down's end.
		limits := outbox.ToolLimits{}
		if !notify {
			limits.MaxInFlight = 100
		}
		status, err = client.SetToolLimits(t.Context(), "refund", limits, outbox.LimitParams{By: "alice", Reason: "limits"})
		require.NoError(t, err)
		require.True(t, status.SlowedDown(time.Now()))

		status, err = client.EndSlowDown(t.Context(), "refund", outbox.EndSlowDownParams{By: "alice", Reason: "the provider raised our quota"})
		require.NoError(t, err)
		require.False(t, status.SlowedDown(time.Now()))
		// The key the slow down sent back, due in an hour, is due now, and
		// its attempt was not spent (MaxAttempts is 1).
		res := awaitState(t, client, key, outbox.StateSucceeded)
		require.Equal(t, 1, res.Attempts)
		awaitState(t, client, later, outbox.StateSucceeded)
		require.EqualValues(t, 3, calls.Load())
		tools, err := client.Tools(t.Context())
		require.NoError(t, err)
		if notify {
			require.Empty(t, tools, "a tool with no limit, pause or slow-down keeps no row")
		} else {
			require.Len(t, tools, 1)
			require.Equal(t, limits, tools[0].Limits)
		}
		actions, err := client.ToolActions(t.Context(), "refund")
		require.NoError(t, err)
		require.Len(t, actions, 2, "the resume of a tool not paused recorded nothing")
		require.Equal(t, outbox.ToolAction{At: actions[0].At, Action: "end_slow_down", By: "alice", Reason: "the provider raised our quota"}, actions[0])
		require.Equal(t, "limit", actions[1].Action)

		// Ending it again changes nothing and records nothing.
		_, err = client.EndSlowDown(t.Context(), "refund", outbox.EndSlowDownParams{By: "alice", Reason: "again"})
		require.NoError(t, err)
		actions, err = client.ToolActions(t.Context(), "refund")
		require.NoError(t, err)
		require.Len(t, actions, 2)
	}

	t.Run("AnOperatorEndsASlowDownEarly", func(t *testing.T) {
		t.Parallel()
		endEarly(t, true)
	})

	t.Run("AnOperatorEndsASlowDownEarlyUnnotified", func(t *testing.T) {
		t.Parallel()
		endEarly(t, false)
	})

	t.Run("EndingASlowDownKeepsLimitsAndPauses", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		_, err := pgoncetest.Pool(t).Exec(t.Context(), `INSERT INTO "`+bundle.schema+`".pgonce_tool (tool, not_before)
			VALUES ('refund', now() + interval '1 hour'), ('email', now() + interval '1 hour')`)
		require.NoError(t, err)
		_, err = bundle.client.SetToolLimits(t.Context(), "refund", outbox.ToolLimits{MaxInFlight: 5},
			outbox.LimitParams{By: "test", Reason: "five at a time"})
		require.NoError(t, err)
		_, err = bundle.client.Pause(t.Context(), "email", outbox.PauseParams{By: "test", Reason: "incident"})
		require.NoError(t, err)
		for _, tool := range []string{"refund", "email"} {
			status, err := bundle.client.EndSlowDown(t.Context(), tool, outbox.EndSlowDownParams{By: "test", Reason: "quota raised"})
			require.NoError(t, err)
			require.False(t, status.SlowedDown(time.Now()), tool)
		}
		statuses, err := bundle.client.Tools(t.Context())
		require.NoError(t, err)
		require.Len(t, statuses, 2)
		require.True(t, statuses[0].Paused)
		require.Equal(t, 5, statuses[1].Limits.MaxInFlight)
		for _, bad := range []struct {
			tool   string
			params outbox.EndSlowDownParams
		}{
			{"Refund", outbox.EndSlowDownParams{By: "a", Reason: "b"}},
			{"refund", outbox.EndSlowDownParams{By: "a"}},
			{"refund", outbox.EndSlowDownParams{Reason: "b"}},
		} {
			_, err := bundle.client.EndSlowDown(t.Context(), bad.tool, bad.params)
			require.ErrorIs(t, err, outbox.ErrInvalidParams, "%+v", bad)
		}
	})

	t.Run("ASlowDownThatEndedLeavesLimitsAndPausesAlone", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		// Two slow-downs that ended a second ago.
		_, err := pgoncetest.Pool(t).Exec(t.Context(), `INSERT INTO "`+bundle.schema+`".pgonce_tool (tool, not_before)
			VALUES ('refund', now() - interval '1 second'), ('email', now() - interval '1 second')`)
		require.NoError(t, err)
		_, err = bundle.client.SetToolLimits(t.Context(), "refund", outbox.ToolLimits{MaxInFlight: 5},
			outbox.LimitParams{By: "test", Reason: "five at a time"})
		require.NoError(t, err)
		_, err = bundle.client.Pause(t.Context(), "email", outbox.PauseParams{By: "test", Reason: "incident"})
		require.NoError(t, err)
		d, err := dispatcher.New(bundle.client, dispatcher.Config{PollInterval: 20 * time.Millisecond})
		require.NoError(t, err)
		start(t, d)
		key := submit(t, bundle.client, "refund", 1)
		awaitState(t, bundle.client, key, outbox.StateSucceeded)
		statuses, err := bundle.client.Tools(t.Context())
		require.NoError(t, err)
		require.Len(t, statuses, 2)
		require.Equal(t, 5, statuses[1].Limits.MaxInFlight)
		require.True(t, statuses[0].Paused)
	})
}

func TestFlowPause(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testFlowPause[pgx.Tx], testFlowPause[*sql.Tx])
}

func testFlowPause[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()

	t.Run("PausedKeysWaitAndResumeRunsThem", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		status, err := bundle.client.Pause(t.Context(), "refund", outbox.PauseParams{By: "alice", Reason: "provider incident"})
		require.NoError(t, err)
		require.True(t, status.Paused)
		require.Equal(t, "alice", status.PausedBy)
		require.Equal(t, "provider incident", status.PausedReason)

		paused := bundle.submitAll(t, bundle.client, callsFrom("refund", 0, 3))
		other := submit(t, bundle.client, "provision", 100)
		start(t, mustDispatcher(t, bundle.client))

		// The dispatcher claimed the other tool's key, in a claim that held
		// the paused tool's back.
		awaitState(t, bundle.client, other, outbox.StateSucceeded)
		for _, key := range paused {
			res, err := bundle.client.Get(t.Context(), key)
			require.NoError(t, err)
			require.Equal(t, outbox.StatePending, res.State)
			calls, _ := bundle.ledger.count(key)
			require.Zero(t, calls)
		}

		status, err = bundle.client.Resume(t.Context(), "refund", outbox.ResumeParams{By: "bob"})
		require.NoError(t, err)
		require.False(t, status.Paused)
		for _, key := range paused {
			awaitState(t, bundle.client, key, outbox.StateSucceeded)
		}
		actions, err := bundle.client.ToolActions(t.Context(), "refund")
		require.NoError(t, err)
		require.Len(t, actions, 2)
		require.Equal(t, "resume", actions[0].Action)
		require.Equal(t, "bob", actions[0].By)
		require.Equal(t, "pause", actions[1].Action)
		require.Equal(t, "provider incident", actions[1].Reason)
		tools, err := bundle.client.Tools(t.Context())
		require.NoError(t, err)
		require.Empty(t, tools, "a resumed tool without limits keeps no flow control")
	})

	t.Run("PauseTwiceKeepsTheFirst", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		_, err := bundle.client.Pause(t.Context(), "refund", outbox.PauseParams{By: "alice", Reason: "first"})
		require.NoError(t, err)
		status, err := bundle.client.Pause(t.Context(), "refund", outbox.PauseParams{By: "bob", Reason: "second"})
		require.NoError(t, err)
		require.Equal(t, "alice", status.PausedBy)
		actions, err := bundle.client.ToolActions(t.Context(), "refund")
		require.NoError(t, err)
		require.Len(t, actions, 1)
	})

	t.Run("BadInputChangesNothing", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		for _, tt := range []struct {
			name string
			err  func() error
		}{
			{"NoTool", func() error {
				_, err := bundle.client.Pause(t.Context(), "", outbox.PauseParams{By: "a", Reason: "b"})
				return err
			}},
			{"NoReason", func() error {
				_, err := bundle.client.Pause(t.Context(), "refund", outbox.PauseParams{By: "a"})
				return err
			}},
			{"NULInTool", func() error {
				_, err := bundle.client.Resume(t.Context(), "re\x00fund", outbox.ResumeParams{By: "a"})
				return err
			}},
			{"NegativeLimit", func() error {
				_, err := bundle.client.SetToolLimits(t.Context(), "refund", outbox.ToolLimits{MaxInFlight: -1}, outbox.LimitParams{By: "a", Reason: "b"})
				return err
			}},
			{"BurstWithoutRate", func() error {
				_, err := bundle.client.SetToolLimits(t.Context(), "refund", outbox.ToolLimits{Burst: 3}, outbox.LimitParams{By: "a", Reason: "b"})
				return err
			}},
		} {
			require.ErrorIs(t, tt.err(), outbox.ErrInvalidParams, tt.name)
		}
		tools, err := bundle.client.Tools(t.Context())
		require.NoError(t, err)
		require.Empty(t, tools)
	})
}

func mustDispatcher[TTx any](t *testing.T, client *outbox.Client[TTx]) *dispatcher.Dispatcher[TTx] {
	t.Helper()
	d, err := dispatcher.New(client, fastConfig())
	require.NoError(t, err)
	return d
}
