package httpprovider_test

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/httpprovider"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/reconcile"
)

// TestExactlyOnceAgainstAKeyedAPI runs refunds through dispatchers to the
// fake payment API while it drops connections after acting, answers 500
// after acting, rate-limits with 429 and Retry-After, declines, and holds
// answers while the dispatcher that sent them stops without recording
// (its calls cancelled, its rows left in flight for the reconciler). Every
// action has exactly one effect at the API, and every key ends with the
// API's own answer.
func TestExactlyOnceAgainstAKeyedAPI(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testExactlyOnce, testExactlyOnce)
}

type action struct {
	order int
	fault string
}

func testExactlyOnce[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()
	ctx := t.Context()
	fake := newFakeProvider(t)
	p, err := httpprovider.New(httpprovider.Config{
		URL:          fake.server.URL + "/v1/refunds",
		KeepHeaders:  []string{"Request-Id"},
		Timeout:      time.Second,
		KeyRetention: 24 * time.Hour,
	})
	require.NoError(t, err)
	registry := outbox.NewRegistry()
	require.NoError(t, p.Register(registry, "refund"))
	schema := pgoncetest.Schema(t)
	// A short lease, so that rows a stopped dispatcher left in flight
	// expire within the test.
	client := driver.Client(t, outbox.Config{Schema: schema, Registry: registry, Logger: quiet, CallTimeout: time.Second, Lease: 2 * time.Second})

	faults := []string{faultNone, faultDrop, fault500, fault429, faultDeclined, faultNone, faultSlow}
	var calls []outbox.Call
	var actions []action
	for i := range 42 {
		a := action{order: 1000 + i, fault: faults[i%len(faults)]}
		actions = append(actions, a)
		calls = append(calls, outbox.Call{
			RunID: "run-1", Step: int64(i), Tool: "refund",
			Args: map[string]any{"order": a.order, "amount": 42, "fault": a.fault},
		})
	}
	keys := driver.SubmitKeys(t, client, calls)

	fast := dispatcher.Config{
		Concurrency:         8,
		PollInterval:        20 * time.Millisecond,
		BackoffFunc:         func(int) time.Duration { return 10 * time.Millisecond },
		MaxAttempts:         1000,
		MaintenanceDisabled: true,
	}

	// The first dispatcher takes work until the slow answers hold some of
	// its calls, then stops at once: those calls are cancelled after the
	// API acted, and their rows stay in flight.
	first, err := dispatcher.New(client, dispatcher.Config{
		Concurrency: 16, BatchSize: 64, PollInterval: fast.PollInterval, BackoffFunc: fast.BackoffFunc,
		MaxAttempts: fast.MaxAttempts, MaintenanceDisabled: true, ShutdownTimeout: -1,
	})
	require.NoError(t, err)
	firstCtx, stopFirst := context.WithCancel(ctx)
	firstDone := make(chan error, 1)
	go func() { firstDone <- first.Run(firstCtx) }()
	requireEventually(t, func() bool { return fake.running() == 6 }, "the slow answers held")
	stopFirst()
	require.NoError(t, <-firstDone)

	// Two more dispatchers and a reconciler finish the work; the held
	// answers go once the first dispatcher is gone.
	fake.releaseSlow()
	var wg sync.WaitGroup
	runCtx, stop := context.WithCancel(ctx)
	for range 2 {
		d, err := dispatcher.New(client, fast)
		require.NoError(t, err)
		wg.Go(func() { _ = d.Run(runCtx) })
	}
	rec, err := reconcile.New(client, reconcile.Config{Grace: time.Millisecond})
	require.NoError(t, err)
	wg.Go(func() { _ = rec.Run(runCtx, 50*time.Millisecond) })
	t.Cleanup(func() { stop(); wg.Wait() })

	for i, key := range keys {
		waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
		res, err := client.Wait(waitCtx, key)
		cancel()
		a := actions[i]
		status, answer, reqID := fake.answerOf(string(key))
		if a.fault == faultDeclined {
			require.NoError(t, err, "order %d", a.order)
			require.Equal(t, outbox.StateFailed, res.State, "order %d", a.order)
			require.Equal(t, 0, fake.effectsOf(string(key)), "order %d", a.order)
			stored, err := httpprovider.Decode(res.Failure)
			require.NoError(t, err)
			require.Equal(t, http.StatusPaymentRequired, stored.Status)
			require.Equal(t, string(answer), string(stored.Body), "the API's failure, verbatim")
			continue
		}
		require.NoError(t, err, "order %d (%s)", a.order, a.fault)
		require.Equal(t, outbox.StateSucceeded, res.State)
		require.Equal(t, 1, fake.effectsOf(string(key)), "order %d (%s): one effect", a.order, a.fault)
		stored, err := httpprovider.Decode(res.Response)
		require.NoError(t, err)
		require.Equal(t, status, stored.Status)
		require.Equal(t, http.StatusCreated, stored.Status)
		require.Equal(t, string(answer), string(stored.Body), "the API's answer, verbatim")
		require.Equal(t, reqID, stored.Header.Get("Request-Id"))
		if a.fault == fault429 {
			times := fake.requestTimes(string(key))
			require.GreaterOrEqual(t, len(times), 2)
			require.GreaterOrEqual(t, times[1].Sub(times[0]), time.Second, "Retry-After: 1 honoured")
		}
	}
	require.Equal(t, len(actions)-len(actions)/len(faults), fake.totalEffects(), "one effect per action that was not declined, none else")
	pgoncetest.RequireKeyInvariants(t, schema)
}

// TestAbandonedAttemptIsRetriedByKey leaves keys as a worker killed after
// the API acted leaves them: in flight under an expired lease, no outcome
// recorded. The reconciler sends them back by key, a dispatcher asks
// again, and the API replays: one effect each.
func TestAbandonedAttemptIsRetriedByKey(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testAbandoned, testAbandoned)
}

func testAbandoned[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()
	ctx := t.Context()
	fake := newFakeProvider(t)
	p, err := httpprovider.New(httpprovider.Config{URL: fake.server.URL + "/v1/refunds"})
	require.NoError(t, err)
	registry := outbox.NewRegistry()
	require.NoError(t, p.Register(registry, "refund"))
	schema := pgoncetest.Schema(t)
	client := driver.Client(t, outbox.Config{Schema: schema, Registry: registry, Logger: quiet})

	var calls []outbox.Call
	for i := range 8 {
		calls = append(calls, outbox.Call{RunID: "run-2", Step: int64(i), Tool: "refund", Args: map[string]any{"order": i, "fault": faultDrop}})
	}
	keys := driver.SubmitKeys(t, client, calls)
	// The dead worker's calls: the API acted, the answer never came back.
	for i, key := range keys {
		args, err := outbox.Canonicalize(calls[i].Args)
		require.NoError(t, err)
		_, err = p.Call(ctx, outbox.Request{Key: key, Tool: "refund", Args: args, Attempt: 1})
		require.True(t, outbox.IsAmbiguous(err), "%v", err)
	}
	pgoncetest.AbandonKeys(t, schema, time.Minute, keys...)

	rec, err := reconcile.New(client, reconcile.Config{Grace: time.Millisecond})
	require.NoError(t, err)
	report, err := rec.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, len(keys), report.Examined["refund"])

	d, err := dispatcher.New(client, dispatcher.Config{PollInterval: 20 * time.Millisecond, MaintenanceDisabled: true})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	defer func() { stop(); require.NoError(t, <-done) }()
	for _, key := range keys {
		waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		res, err := client.Wait(waitCtx, key)
		cancel()
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, res.State)
		require.Equal(t, 1, fake.effectsOf(string(key)))
		stored, err := httpprovider.Decode(res.Response)
		require.NoError(t, err)
		_, answer, _ := fake.answerOf(string(key))
		require.Equal(t, string(answer), string(stored.Body))
	}
}

// requireEventually fails t unless cond holds within 30 seconds, checked
// every 10 ms.
func requireEventually(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// quiet drops the logs of the clients under test: the faults are
// expected.
var quiet = slog.New(slog.DiscardHandler)
