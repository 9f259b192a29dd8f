package reconcile_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/reconcile"
)

// payments honours idempotency keys, and can be asked about natural ids: its
// effects are what a real provider would have done.
type payments struct {
	mu      sync.Mutex
	effects map[string]int // by natural id
	calls   int
}

func (p *payments) Call(_ context.Context, req outbox.Request) (json.RawMessage, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	if p.effects[req.NaturalID] == 0 {
		p.effects[req.NaturalID]++
	}
	return json.RawMessage(`{"ok":true}`), nil
}

func (p *payments) Lookup(_ context.Context, req outbox.Request) (json.RawMessage, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.effects[req.NaturalID] == 0 {
		return nil, false, nil
	}
	return json.RawMessage(fmt.Sprintf(`{"found":%q}`, req.NaturalID)), true, nil
}

type testBundle[TTx any] struct {
	client   *outbox.Client[TTx]
	driver   drivertest.Driver[TTx]
	payments *payments
	schema   string
}

func setup[TTx any](t *testing.T, driver drivertest.Driver[TTx]) *testBundle[TTx] {
	t.Helper()
	schema := pgoncetest.Schema(t)
	p := &payments{effects: map[string]int{}}
	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("refund", p, outbox.IdempotentByKey))
	require.NoError(t, registry.Register("provision", p, outbox.LookupByNaturalID))
	require.NoError(t, registry.Register("email", p, outbox.AtMostOnce))
	client := driver.Client(t, outbox.Config{Schema: schema, Registry: registry})
	return &testBundle[TTx]{client: client, driver: driver, payments: p, schema: schema}
}

// serving makes the bundle's client one of its driver over the bundle's
// schema that serves registry, and returns it.
func (b *testBundle[TTx]) serving(t *testing.T, registry *outbox.Registry) *outbox.Client[TTx] {
	t.Helper()
	b.client = b.driver.Client(t, outbox.Config{Schema: b.schema, Registry: registry})
	return b.client
}

// call is the call of tool at step that the tests submit.
func call(tool string, step int64) outbox.Call {
	return outbox.Call{
		RunID: "run", Step: step, Tool: tool, NaturalID: fmt.Sprintf("nat-%d", step), Args: map[string]any{"step": step},
	}
}

// crashed submits calls through the bundle's client, in one transaction of
// its driver, and leaves them as a killed worker does: in flight, under a
// lease that ended leaseAgo ago.
func crashed[TTx any](t *testing.T, bundle *testBundle[TTx], leaseAgo time.Duration, calls ...outbox.Call) []outbox.Key {
	t.Helper()
	keys := bundle.driver.SubmitKeys(t, bundle.client, calls)
	pgoncetest.AbandonKeys(t, bundle.schema, leaseAgo, keys...)
	return keys
}

// crashedOne is [crashed] of the call of tool at step.
func crashedOne[TTx any](t *testing.T, bundle *testBundle[TTx], tool string, step int64, leaseAgo time.Duration) outbox.Key {
	t.Helper()
	return crashed(t, bundle, leaseAgo, call(tool, step))[0]
}

func state[TTx any](t *testing.T, bundle *testBundle[TTx], key outbox.Key) outbox.State {
	t.Helper()
	res, err := bundle.client.Get(t.Context(), key)
	require.NoError(t, err)
	return res.State
}

func TestRunOnce(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testRunOnce[pgx.Tx], testRunOnce[*sql.Tx])
}

func testRunOnce[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()

	t.Run("ResolvesEachDeliveryMode", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		// The crashed worker's provider acted for step 2 but nobody recorded it.
		bundle.payments.effects["nat-2"] = 1
		crashedKeys := crashed(t, bundle, time.Hour,
			call("refund", 1), call("provision", 2), call("provision", 3), call("email", 4))
		keyed, lookedUpFound, lookedUpMissing, atMostOnce := crashedKeys[0], crashedKeys[1], crashedKeys[2], crashedKeys[3]

		r, err := reconcile.New(bundle.client, reconcile.Config{})
		require.NoError(t, err)
		report, err := r.RunOnce(t.Context())
		require.NoError(t, err)

		require.Equal(t, map[string]int{"refund": 1, "provision": 2, "email": 1}, report.Examined)
		require.Equal(t, 1, report.Resolved["refund"][reconcile.OutcomeRequeued])
		require.Equal(t, 1, report.Resolved["provision"][reconcile.OutcomeFound])
		require.Equal(t, 1, report.Resolved["provision"][reconcile.OutcomeRequeued])
		require.Equal(t, 1, report.Resolved["email"][reconcile.OutcomeNeedsReview])

		require.Equal(t, outbox.StatePending, state(t, bundle, keyed))
		require.Equal(t, outbox.StateSucceeded, state(t, bundle, lookedUpFound))
		require.Equal(t, outbox.StatePending, state(t, bundle, lookedUpMissing))
		require.Equal(t, outbox.StateNeedsReview, state(t, bundle, atMostOnce))
		require.Zero(t, bundle.payments.calls, "the reconciler never calls a provider")

		// The requeued rows run once more; every effect happened once.
		for _, step := range []int64{1, 3} {
			tool := map[int64]string{1: "refund", 3: "provision"}[step]
			res, err := bundle.client.Do(t.Context(), call(tool, step), nil)
			require.NoError(t, err)
			require.Equal(t, outbox.StateSucceeded, res.State)
		}
		for _, id := range []string{"nat-1", "nat-2", "nat-3"} {
			require.Equal(t, 1, bundle.payments.effects[id], id)
		}
		require.Zero(t, bundle.payments.effects["nat-4"], "at-most-once never retried")

		// Nothing is left to resolve.
		report, err = r.RunOnce(t.Context())
		require.NoError(t, err)
		require.Empty(t, report.Examined)
	})

	t.Run("LiveLeaseIsNotTouched", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		live := crashedOne(t, bundle, "email", 1, -time.Hour) // lease ends in an hour
		withinGrace := crashedOne(t, bundle, "email", 2, time.Second)

		r, err := reconcile.New(bundle.client, reconcile.Config{})
		require.NoError(t, err)
		report, err := r.RunOnce(t.Context())
		require.NoError(t, err)
		require.Empty(t, report.Examined)
		require.Equal(t, outbox.StateInFlight, state(t, bundle, live))
		require.Equal(t, outbox.StateInFlight, state(t, bundle, withinGrace))
	})

	t.Run("UnregisteredToolIsSkippedAndCounted", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		key := crashedOne(t, bundle, "email", 1, time.Hour)
		narrow := outbox.NewRegistry()
		require.NoError(t, narrow.Register("refund", bundle.payments, outbox.IdempotentByKey))
		client := driver.Client(t, outbox.Config{Schema: bundle.schema, Registry: narrow})

		r, err := reconcile.New(client, reconcile.Config{})
		require.NoError(t, err)
		report, err := r.RunOnce(t.Context())
		require.NoError(t, err)
		require.Equal(t, map[string]int{"email": 1}, report.SkippedUnregistered)
		require.Equal(t, outbox.StateInFlight, state(t, bundle, key))
	})

	t.Run("StalePendingIsReportedNotTouched", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		res, err := bundle.client.Submit(t.Context(), outbox.Call{RunID: "run", Step: 1, Tool: "refund", Args: map[string]any{}})
		require.NoError(t, err)
		_, err = pgoncetest.Pool(t).Exec(t.Context(),
			`UPDATE "`+bundle.schema+`".pgonce_key SET available_at = now() - interval '1 hour'`)
		require.NoError(t, err)

		r, err := reconcile.New(bundle.client, reconcile.Config{})
		require.NoError(t, err)
		report, err := r.RunOnce(t.Context())
		require.NoError(t, err)
		require.Equal(t, 1, report.StalePending)
		require.Greater(t, report.OldestStalePending.Minutes(), 59.0)
		require.Equal(t, outbox.StatePending, state(t, bundle, res.Key))
		_, err = json.Marshal(report)
		require.NoError(t, err)
	})

	t.Run("ConcurrentReconcilersResolveEachRowOnce", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		const rows = 1000
		stale := make([]outbox.Call, rows)
		for i := range stale {
			stale[i] = call("email", int64(i))
		}
		crashed(t, bundle, time.Hour, stale...)

		reports := make([]reconcile.Report, 2)
		batches := make([]int, 2)
		var wg sync.WaitGroup
		for i := range reports {
			r, err := reconcile.New(bundle.client, reconcile.Config{
				BatchSize:    50,
				ProgressFunc: func(reconcile.Report) { batches[i]++ },
			})
			require.NoError(t, err)
			wg.Add(1)
			go func() {
				defer wg.Done()
				report, err := r.RunOnce(context.Background())
				if err != nil {
					t.Errorf("reconcile: %v", err)
				}
				reports[i] = report
			}()
		}
		wg.Wait()
		examined := reports[0].Examined["email"] + reports[1].Examined["email"]
		reviewed := reports[0].Resolved["email"][reconcile.OutcomeNeedsReview] + reports[1].Resolved["email"][reconcile.OutcomeNeedsReview]
		superseded := reports[0].Resolved["email"][reconcile.OutcomeSuperseded] + reports[1].Resolved["email"][reconcile.OutcomeSuperseded]
		require.Equal(t, rows, examined)
		require.Equal(t, rows, reviewed)
		require.Zero(t, superseded)
		require.GreaterOrEqual(t, batches[0]+batches[1], rows/50, "progress is reported per batch")
		var needsReview int
		require.NoError(t, pgoncetest.Pool(t).QueryRow(t.Context(),
			`SELECT count(*) FROM "`+bundle.schema+`".pgonce_key WHERE state = 'needs_review'`).Scan(&needsReview))
		require.Equal(t, rows, needsReview)
	})
}

// barrierLookup answers only once all of its lookups are running together:
// a reconciler that looked up one row after another would time out.
type barrierLookup struct {
	payments
	want    int
	mu      sync.Mutex
	started int
	all     chan struct{}
}

func (b *barrierLookup) Lookup(ctx context.Context, req outbox.Request) (json.RawMessage, bool, error) {
	b.mu.Lock()
	b.started++
	if b.started == b.want {
		close(b.all)
	}
	b.mu.Unlock()
	select {
	case <-b.all:
		return nil, false, nil
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
}

// TestRunOnceFollowsTheClientsClock: with Config.NowFunc set, leases follow
// the client's clock, the reconciler's included: a lease that has expired
// by that clock, and not by the database's, is resolved.
func TestRunOnceFollowsTheClientsClock(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testRunOnceFollowsTheClientsClock[pgx.Tx], testRunOnceFollowsTheClientsClock[*sql.Tx])
}

func testRunOnceFollowsTheClientsClock[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()
	bundle := setup(t, driver)
	// Abandoned under a lease that ends in an hour, by the database's clock.
	keyed := crashedOne(t, bundle, "refund", 1, -time.Hour)
	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("refund", bundle.payments, outbox.IdempotentByKey))
	ahead := driver.Client(t, outbox.Config{
		Schema: bundle.schema, Registry: registry,
		NowFunc: func() time.Time { return time.Now().Add(2 * time.Hour) },
	})

	r, err := reconcile.New(ahead, reconcile.Config{})
	require.NoError(t, err)
	report, err := r.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, map[string]int{"refund": 1}, report.Examined)
	require.Equal(t, 1, report.Resolved["refund"][reconcile.OutcomeRequeued])
	require.Equal(t, outbox.StatePending, state(t, bundle, keyed))
}

func TestRunOnceLooksUpABatchAtOnce(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testRunOnceLooksUpABatchAtOnce[pgx.Tx], testRunOnceLooksUpABatchAtOnce[*sql.Tx])
}

func testRunOnceLooksUpABatchAtOnce[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()
	bundle := setup(t, driver)
	const rows = 8
	lookup := &barrierLookup{payments: payments{effects: map[string]int{}}, want: rows, all: make(chan struct{})}
	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("provision", lookup, outbox.LookupByNaturalID))
	client := driver.Client(t, outbox.Config{
		Schema: bundle.schema, Registry: registry, CallTimeout: 5 * time.Second,
	})
	bundle.client = client
	lost := make([]outbox.Call, rows)
	for i := range lost {
		lost[i] = call("provision", int64(i))
	}
	crashed(t, bundle, time.Hour, lost...)

	r, err := reconcile.New(client, reconcile.Config{BatchSize: rows})
	require.NoError(t, err)
	report, err := r.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, rows, report.Resolved["provision"][reconcile.OutcomeRequeued])
	require.Zero(t, report.Resolved["provision"][reconcile.OutcomeLookupFailed])
}

type panickingLookup struct{ payments }

func (*panickingLookup) Lookup(context.Context, outbox.Request) (json.RawMessage, bool, error) {
	panic("lookup bug")
}

func TestRunOnceSurvivesPanickingLookup(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testRunOnceSurvivesPanickingLookup[pgx.Tx], testRunOnceSurvivesPanickingLookup[*sql.Tx])
}

func testRunOnceSurvivesPanickingLookup[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()
	bundle := setup(t, driver)
	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("provision", &panickingLookup{payments{effects: map[string]int{}}}, outbox.LookupByNaturalID))
	client := bundle.serving(t, registry)
	key := crashedOne(t, bundle, "provision", 1, time.Hour)

	r, err := reconcile.New(client, reconcile.Config{})
	require.NoError(t, err)
	report, err := r.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, report.Resolved["provision"][reconcile.OutcomeLookupFailed])

	// Still unknown: pending again, and its next attempt looks up first.
	inspection, err := client.Inspect(t.Context(), key)
	require.NoError(t, err)
	require.Equal(t, outbox.StatePending, inspection.State)
	require.NotNil(t, inspection.Queue)
	require.True(t, inspection.Queue.Ambiguous)
	require.Contains(t, inspection.Queue.LastError, "lookup bug")
}

// badTextLookup fails the lookup of one natural id with error text that
// PostgreSQL rejects in a text column, and looks the others up in payments.
type badTextLookup struct {
	*payments
	bad string
}

func (b badTextLookup) Lookup(ctx context.Context, req outbox.Request) (json.RawMessage, bool, error) {
	if req.NaturalID == b.bad {
		return nil, false, errors.New("lookup \x00 failed \xff")
	}
	return b.payments.Lookup(ctx, req)
}

func TestRunOnceBadLookupErrorTextCostsNoOutcome(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testRunOnceBadLookupErrorTextCostsNoOutcome[pgx.Tx], testRunOnceBadLookupErrorTextCostsNoOutcome[*sql.Tx])
}

func testRunOnceBadLookupErrorTextCostsNoOutcome[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()
	bundle := setup(t, driver)
	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("provision", badTextLookup{bundle.payments, "nat-5"}, outbox.LookupByNaturalID))
	client := bundle.serving(t, registry)
	const rows = 20
	lost := make([]outbox.Call, rows)
	for i := range lost {
		if i%2 == 0 {
			bundle.payments.effects[fmt.Sprintf("nat-%d", i)] = 1
		}
		lost[i] = call("provision", int64(i))
	}
	keys := crashed(t, bundle, time.Hour, lost...)

	r, err := reconcile.New(client, reconcile.Config{BatchSize: rows})
	require.NoError(t, err)
	report, err := r.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, map[reconcile.Outcome]int{
		reconcile.OutcomeFound:        rows / 2,
		reconcile.OutcomeRequeued:     rows/2 - 1,
		reconcile.OutcomeLookupFailed: 1,
	}, report.Resolved["provision"])
	for i, key := range keys {
		want := map[bool]outbox.State{true: outbox.StateSucceeded, false: outbox.StatePending}[i%2 == 0]
		require.Equal(t, want, state(t, bundle, key), "step %d", i)
	}
	inspection, err := client.Inspect(t.Context(), keys[5])
	require.NoError(t, err)
	require.True(t, inspection.Queue.Ambiguous, "the next attempt looks up first")
	require.Equal(t, "lookup: lookup \uFFFD failed \uFFFD", inspection.Queue.LastError)
}

// TestRunOnceAfterAHalfOpenConnection runs on the direct drivers only: its
// client's pool is one of its own, behind a proxy that makes its
// connections half-open, not a pool through a transaction pooler.
func TestRunOnceAfterAHalfOpenConnection(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testRunOnceAfterAHalfOpenConnection[pgx.Tx], testRunOnceAfterAHalfOpenConnection[*sql.Tx])
}

func testRunOnceAfterAHalfOpenConnection[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()
	bundle := setup(t, driver)
	// The reconciler reaches the database through a proxy that can make its
	// connections half-open: the server gone without a word.
	proxy, pool := pgoncetest.NewBlackHoleProxy(t, 8)
	// The statement deadline ends a statement on a half-open connection,
	// and lies far beyond what one on a live connection takes on a loaded
	// machine: a live reclaim cut off by its deadline may have committed on
	// the server, leaving its row under the reconciler's lease.
	const statementTimeout = 2 * time.Second
	client := driver.ClientOver(t, pool, outbox.Config{
		Schema: bundle.schema, Registry: bundle.client.Config().Registry, StatementTimeout: statementTimeout,
	})
	r, err := reconcile.New(client, reconcile.Config{})
	require.NoError(t, err)
	_, err = r.RunOnce(t.Context())
	require.NoError(t, err)

	proxy.BlackHole()
	key := crashedOne(t, bundle, "email", 1, time.Hour)
	// Each run ends within its statements' deadlines, failed or not; one
	// on fresh connections resolves the row.
	deadline := time.Now().Add(time.Minute)
	for {
		done := make(chan error, 1)
		go func() {
			_, err := r.RunOnce(t.Context())
			done <- err
		}()
		select {
		case err = <-done:
		case <-time.After(time.Minute):
			t.Fatal("RunOnce hangs on a half-open connection")
		}
		if err == nil && state(t, bundle, key) == outbox.StateNeedsReview {
			break
		}
		require.True(t, time.Now().Before(deadline), "the row was never resolved: %v", err)
	}
}

// TestNewRefusesAClientNotMadeByNew: a zero outbox.Client has no runner;
// New says so with ErrInvalidConfig instead of panicking.
func TestNewRefusesAClientNotMadeByNew(t *testing.T) {
	t.Parallel()
	_, err := reconcile.New(&outbox.Client[pgx.Tx]{}, reconcile.Config{})
	require.ErrorIs(t, err, reconcile.ErrInvalidConfig)
	_, err = reconcile.New(&outbox.Client[*sql.Tx]{}, reconcile.Config{})
	require.ErrorIs(t, err, reconcile.ErrInvalidConfig)
}
