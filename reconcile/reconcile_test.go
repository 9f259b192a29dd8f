package reconcile_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
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

type testBundle struct {
	client   *outbox.Client[pgx.Tx]
	payments *payments
	schema   string
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	schema := pgoncetest.Schema(t)
	p := &payments{effects: map[string]int{}}
	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("refund", p, outbox.IdempotentByKey))
	require.NoError(t, registry.Register("provision", p, outbox.LookupByNaturalID))
	require.NoError(t, registry.Register("email", p, outbox.AtMostOnce))
	client, err := outbox.NewPgx(pgoncetest.Pool(t), outbox.Config{Schema: schema, Registry: registry})
	require.NoError(t, err)
	return &testBundle{client: client, payments: p, schema: schema}
}

// crashed submits a call and leaves it as a killed worker does: in flight,
// its lease long expired.
func crashed(t *testing.T, bundle *testBundle, tool string, step int64, leaseAgo string) outbox.Key {
	t.Helper()
	res, err := bundle.client.Submit(t.Context(), outbox.Call{
		RunID: "run", Step: step, Tool: tool, NaturalID: fmt.Sprintf("nat-%d", step), Args: map[string]any{"step": step},
	})
	require.NoError(t, err)
	_, err = pgoncetest.Pool(t).Exec(t.Context(), `
		UPDATE "`+bundle.schema+`".pgonce_key
		SET attempt = 1, worker = 'dead-worker', lease_until = now() - $2::interval,
			first_attempted_at = now() - $2::interval - interval '1 minute'
		WHERE key = $1`, string(res.Key), leaseAgo)
	require.NoError(t, err)
	return res.Key
}

func state(t *testing.T, bundle *testBundle, key outbox.Key) outbox.State {
	t.Helper()
	res, err := bundle.client.Get(t.Context(), key)
	require.NoError(t, err)
	return res.State
}

func TestRunOnce(t *testing.T) {
	t.Parallel()

	t.Run("ResolvesEachDeliveryMode", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		keyed := crashed(t, bundle, "refund", 1, "1 hour")
		// The crashed worker's provider acted for step 2 but nobody recorded it.
		bundle.payments.effects["nat-2"] = 1
		lookedUpFound := crashed(t, bundle, "provision", 2, "1 hour")
		lookedUpMissing := crashed(t, bundle, "provision", 3, "1 hour")
		atMostOnce := crashed(t, bundle, "email", 4, "1 hour")

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
			res, err := bundle.client.Do(t.Context(), outbox.Call{
				RunID: "run", Step: step, Tool: tool, NaturalID: fmt.Sprintf("nat-%d", step), Args: map[string]any{"step": step},
			}, nil)
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
		bundle := setup(t)
		live := crashed(t, bundle, "email", 1, "-1 hour") // lease ends in an hour
		withinGrace := crashed(t, bundle, "email", 2, "1 second")

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
		bundle := setup(t)
		key := crashed(t, bundle, "email", 1, "1 hour")
		narrow := outbox.NewRegistry()
		require.NoError(t, narrow.Register("refund", bundle.payments, outbox.IdempotentByKey))
		client, err := outbox.NewPgx(pgoncetest.Pool(t), outbox.Config{Schema: bundle.schema, Registry: narrow})
		require.NoError(t, err)

		r, err := reconcile.New(client, reconcile.Config{})
		require.NoError(t, err)
		report, err := r.RunOnce(t.Context())
		require.NoError(t, err)
		require.Equal(t, map[string]int{"email": 1}, report.SkippedUnregistered)
		require.Equal(t, outbox.StateInFlight, state(t, bundle, key))
	})

	t.Run("StalePendingIsReportedNotTouched", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
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
		bundle := setup(t)
		const rows = 1000
		_, err := pgoncetest.Pool(t).Exec(t.Context(), `
			INSERT INTO "`+bundle.schema+`".pgonce_key (key, scope, tenant, run_id, step, business_key, tool, natural_id, fingerprint, args,
				attempt, worker, lease_until, first_attempted_at)
			SELECT 'k1_' || encode(sha256(('stale' || i)::bytea), 'hex'), 'scope-' || i, '', 'stale', i, '', 'email', '', 'f', '{}'::bytea,
				1, 'dead-worker', now() - interval '1 hour', now() - interval '2 hours'
			FROM generate_series(1, $1::int) AS i`, rows)
		require.NoError(t, err)

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

func TestRunOnceLooksUpABatchAtOnce(t *testing.T) {
	t.Parallel()
	bundle := setup(t)
	const rows = 8
	lookup := &barrierLookup{payments: payments{effects: map[string]int{}}, want: rows, all: make(chan struct{})}
	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("provision", lookup, outbox.LookupByNaturalID))
	client, err := outbox.NewPgx(pgoncetest.Pool(t), outbox.Config{
		Schema: bundle.schema, Registry: registry, CallTimeout: 5 * time.Second,
	})
	require.NoError(t, err)
	bundle.client = client
	for i := range rows {
		crashed(t, bundle, "provision", int64(i), "1 hour")
	}

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
	bundle := setup(t)
	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("provision", &panickingLookup{payments{effects: map[string]int{}}}, outbox.LookupByNaturalID))
	client, err := outbox.NewPgx(pgoncetest.Pool(t), outbox.Config{Schema: bundle.schema, Registry: registry})
	require.NoError(t, err)
	bundle.client = client
	key := crashed(t, bundle, "provision", 1, "1 hour")

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
	bundle := setup(t)
	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("provision", badTextLookup{bundle.payments, "nat-5"}, outbox.LookupByNaturalID))
	client, err := outbox.NewPgx(pgoncetest.Pool(t), outbox.Config{Schema: bundle.schema, Registry: registry})
	require.NoError(t, err)
	bundle.client = client
	const rows = 20
	keys := make([]outbox.Key, rows)
	for i := range keys {
		if i%2 == 0 {
			bundle.payments.effects[fmt.Sprintf("nat-%d", i)] = 1
		}
		keys[i] = crashed(t, bundle, "provision", int64(i), "1 hour")
	}

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

func TestRunOnceAfterAHalfOpenConnection(t *testing.T) {
	t.Parallel()
	bundle := setup(t)
	// The reconciler reaches the database through a proxy that can make its
	// connections half-open: the server gone without a word.
	proxy, pool := pgoncetest.NewBlackHoleProxy(t, 8)
	client, err := outbox.NewPgx(pool, outbox.Config{
		Schema: bundle.schema, Registry: bundle.client.Config().Registry, StatementTimeout: 500 * time.Millisecond,
	})
	require.NoError(t, err)
	r, err := reconcile.New(client, reconcile.Config{})
	require.NoError(t, err)
	_, err = r.RunOnce(t.Context())
	require.NoError(t, err)

	proxy.BlackHole()
	key := crashed(t, bundle, "email", 1, "1 hour")
	// Each run ends within its statements' deadlines, failed or not; one
	// on fresh connections resolves the row.
	deadline := time.Now().Add(30 * time.Second)
	for {
		done := make(chan error, 1)
		go func() {
			_, err := r.RunOnce(t.Context())
			done <- err
		}()
		select {
		case err = <-done:
		case <-time.After(20 * time.Second):
			t.Fatal("RunOnce hangs on a half-open connection")
		}
		if err == nil && state(t, bundle, key) == outbox.StateNeedsReview {
			break
		}
		require.True(t, time.Now().Before(deadline), "the row was never resolved: %v", err)
	}
}
