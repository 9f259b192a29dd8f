package toolcall_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/reconcile"
	"github.com/pgonce/pgonce/toolcall"
)

// ledger is a payment provider that honours idempotency keys, as Stripe
// does: the first call with a key refunds (a row), every later call with it
// answers the same refund. Its ledger is a table of the test's schema, so a
// test counts effects, not calls: a call again with a key is a legitimate
// retry (an attempt past its call timeout on a busy machine).
type ledger struct {
	pool   *pgxpool.Pool
	table  string
	calls  atomic.Int64
	keys   sync.Map                        // outbox.Key → struct{}: the keys it was called with
	before func(ctx context.Context) error // runs before the refund, when set
	after  func(ctx context.Context) error // runs after the refund, when set
	// detached refunds whatever the call's deadline: a crashed process's
	// provider, which must act before it hangs however slow the machine.
	detached bool
}

func newLedger(t *testing.T, schema string) *ledger {
	t.Helper()
	pool := pgoncetest.Pool(t)
	table := pgx.Identifier{schema, "ledger"}.Sanitize()
	_, err := pool.Exec(t.Context(), `CREATE TABLE `+table+` (
		key text PRIMARY KEY, refund_id bigserial, order_id bigint NOT NULL, amount text NOT NULL)`)
	require.NoError(t, err)
	return &ledger{pool: pool, table: table}
}

func (l *ledger) Call(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
	l.calls.Add(1)
	l.keys.Store(req.Key, struct{}{})
	if l.before != nil {
		if err := l.before(ctx); err != nil {
			return nil, err
		}
	}
	var args struct {
		Order  int64  `json:"order"`
		Amount string `json:"amount"`
	}
	if err := json.Unmarshal(req.Args, &args); err != nil {
		return nil, outbox.Permanent(err)
	}
	if l.detached {
		ctx = context.WithoutCancel(ctx)
	}
	if _, err := l.pool.Exec(ctx, `INSERT INTO `+l.table+` (key, order_id, amount) VALUES ($1, $2, $3)
		ON CONFLICT (key) DO NOTHING`, string(req.Key), args.Order, args.Amount); err != nil {
		return nil, err
	}
	var id int64
	if err := l.pool.QueryRow(ctx, `SELECT refund_id FROM `+l.table+` WHERE key = $1`, string(req.Key)).Scan(&id); err != nil {
		return nil, err
	}
	if l.after != nil {
		if err := l.after(ctx); err != nil {
			return nil, err
		}
	}
	// Spacing of the provider's own, kept byte for byte.
	return json.RawMessage(fmt.Sprintf(`{"refund_id": "re_%d",  "amount": %q}`, id, args.Amount)), nil
}

func (l *ledger) refunds(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, l.pool.QueryRow(context.WithoutCancel(t.Context()), `SELECT count(*) FROM `+l.table).Scan(&n))
	return n
}

type testBundle[TTx any] struct {
	schema   string
	ledger   *ledger
	registry *outbox.Registry
	client   *outbox.Client[TTx]
	exec     *toolcall.Executor[TTx]
}

func setup[TTx any](t *testing.T, d drivertest.Driver[TTx], config toolcall.Config) *testBundle[TTx] {
	t.Helper()
	schema := pgoncetest.Schema(t)
	l := newLedger(t, schema)
	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("refund", l, outbox.IdempotentByKey))
	client := d.Client(t, outbox.Config{Schema: schema, Registry: registry})
	exec, err := toolcall.NewExecutor(client, config)
	require.NoError(t, err)
	return &testBundle[TTx]{schema: schema, ledger: l, registry: registry, client: client, exec: exec}
}

func TestExecutor(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testExecutor[pgx.Tx], testExecutor[*sql.Tx])
}

func testExecutor[TTx any](t *testing.T, d drivertest.Driver[TTx]) {
	t.Helper()
	turn := toolcall.Turn{RunID: "run-8842", FirstStep: 3}
	refund := turn.Call(0, "call_first", "refund", `{"order": 8842, "amount": "42.00"}`)

	t.Run("ReaskWithRespelledArgumentsReplaysByteForByte", func(t *testing.T) {
		t.Parallel()
		b := setup(t, d, toolcall.Config{})

		first := b.exec.Run(t.Context(), refund)[0]
		require.NoError(t, first.Err)
		require.Equal(t, outbox.StateSucceeded, first.Result.State)
		require.False(t, first.IsError())
		require.Equal(t, `{"status":"succeeded","key":"`+string(first.Result.Key)+`","response":{"refund_id": "re_1",  "amount": "42.00"}}`, first.Text())

		// The model asks again in a new message: another id, the members in
		// another order, another spelling of the same values.
		again := turn.Call(0, "call_second", "refund", "{\n  \"amount\": \"42.00\",\n  \"order\": 8.842e3\n}")
		second := b.exec.Run(t.Context(), again)[0]
		require.NoError(t, second.Err)
		require.True(t, second.Result.Replayed(), "the runtime can still tell a replay")
		require.Equal(t, first.Result.Key, second.Result.Key)
		require.Equal(t, first.Text(), second.Text(), "the model reads the same bytes on every ask")
		require.Equal(t, 1, b.ledger.refunds(t))

		// The model's id is kept for operators, that of the first ask.
		inspection, err := b.client.Inspect(t.Context(), first.Result.Key)
		require.NoError(t, err)
		require.Equal(t, map[string]string{toolcall.MetadataToolCallID: "call_first"}, inspection.Metadata)
	})

	t.Run("ModelIDNeverInTheKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t, d, toolcall.Config{})
		call, err := b.exec.OutboxCall(refund)
		require.NoError(t, err)
		key, err := outbox.DeriveKey(call)
		require.NoError(t, err)
		for _, id := range []string{"", "call_other", "toolu_01", strings.Repeat("x", 1000), "bad\x00id", "\xff"} {
			other := refund
			other.ID = id
			call, err := b.exec.OutboxCall(other)
			require.NoError(t, err)
			otherKey, err := outbox.DeriveKey(call)
			require.NoError(t, err)
			require.Equal(t, key, otherKey, "id %q", id)
			out := b.exec.Run(t.Context(), other)[0]
			require.NoError(t, out.Err, "id %q", id)
			require.Equal(t, key, out.Result.Key)
		}
		require.Equal(t, 1, b.ledger.refunds(t))
	})

	t.Run("ConcurrentDuplicatesRunOnceAndAllReadTheOutcome", func(t *testing.T) {
		t.Parallel()
		b := setup(t, d, toolcall.Config{})
		const asks = 8
		// The provider holds until every ask has been made, so the asks
		// meet the action in flight.
		started := make(chan struct{})
		var once sync.Once
		release := make(chan struct{})
		b.ledger.before = func(ctx context.Context) error {
			once.Do(func() { close(started) })
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		outs := make([]toolcall.Outcome, asks)
		var wg sync.WaitGroup
		for i := range asks {
			wg.Go(func() {
				outs[i] = b.exec.Run(t.Context(), turn.Call(0, fmt.Sprintf("call_%d", i), "refund", `{"amount":"42.00","order":8842}`))[0]
			})
		}
		<-started
		waitInFlight(t, b.client)
		close(release)
		wg.Wait()
		for i := range asks {
			require.Equal(t, outbox.ObservationSucceeded, outs[i].Observation().Status, "ask %d: %s", i, outs[i].Text())
			require.Equal(t, outs[0].Text(), outs[i].Text())
		}
		require.Equal(t, 1, b.ledger.refunds(t))
		var called []outbox.Key
		b.ledger.keys.Range(func(key, _ any) bool {
			called = append(called, key.(outbox.Key))
			return true
		})
		require.Equal(t, []outbox.Key{outs[0].Result.Key}, called, "one action: the provider was called with one key")
	})

	t.Run("InvalidArgumentsNeverRun", func(t *testing.T) {
		t.Parallel()
		b := setup(t, d, toolcall.Config{})
		out := b.exec.Run(t.Context(), turn.Call(0, "call_1", "refund", `{"order": 8842, "amount": "42.00"`))[0]
		require.ErrorIs(t, out.Err, toolcall.ErrInvalidArguments)
		obs := out.Observation()
		require.Equal(t, outbox.ObservationInvalidArguments, obs.Status)
		require.True(t, out.IsError())
		require.Equal(t, int64(0), b.ledger.calls.Load())
		page, err := b.client.List(t.Context(), outbox.ListParams{})
		require.NoError(t, err)
		require.Empty(t, page.Keys, "nothing was written")
	})

	t.Run("ReplannedStepIsAConflictAndNothingRuns", func(t *testing.T) {
		t.Parallel()
		b := setup(t, d, toolcall.Config{})
		first := b.exec.Run(t.Context(), refund)[0]
		require.NoError(t, first.Err)
		replanned := b.exec.Run(t.Context(), turn.Call(0, "call_2", "refund", `{"order": 8842, "amount": "4200.00"}`))[0]
		obs := replanned.Observation()
		require.Equal(t, outbox.ObservationConflict, obs.Status, replanned.Text())
		require.Equal(t, first.Result.Key, obs.ExistingKey)
		require.True(t, replanned.IsError())
		require.Equal(t, 1, b.ledger.refunds(t))
	})

	t.Run("UnknownAndRenamedTools", func(t *testing.T) {
		t.Parallel()
		b := setup(t, d, toolcall.Config{})
		for _, name := range []string{"wire_money", "Refund", ""} {
			out := b.exec.Run(t.Context(), turn.Call(0, "call_1", name, `{}`))[0]
			require.Equal(t, outbox.ObservationUnknownTool, out.Observation().Status, name)
		}
		renamed, err := toolcall.NewExecutor(b.client, toolcall.Config{ToolNameFunc: strings.ToLower})
		require.NoError(t, err)
		out := renamed.Run(t.Context(), turn.Call(0, "call_1", "Refund", `{"order":8842,"amount":"42.00"}`))[0]
		require.Equal(t, outbox.ObservationSucceeded, out.Observation().Status, out.Text())
	})

	t.Run("ProviderFailureReadsInProgressAndTheNextAskRetries", func(t *testing.T) {
		t.Parallel()
		b := setup(t, d, toolcall.Config{})
		var fail atomic.Bool
		fail.Store(true)
		b.ledger.before = func(context.Context) error {
			if fail.Load() {
				return errors.New("503 from the payment provider")
			}
			return nil
		}
		out := b.exec.Run(t.Context(), refund)[0]
		require.ErrorIs(t, out.Err, outbox.ErrProviderFailed)
		require.Equal(t, outbox.ObservationInProgress, out.Observation().Status)
		require.NotContains(t, out.Text(), "503", "the provider's error text is never shown to the model")
		fail.Store(false)
		out = b.exec.Run(t.Context(), refund)[0]
		require.NoError(t, out.Err)
		require.Equal(t, outbox.ObservationSucceeded, out.Observation().Status)
		require.Equal(t, 1, b.ledger.refunds(t))
	})

	t.Run("PermanentFailureIsTheSameErrorOnEveryAsk", func(t *testing.T) {
		t.Parallel()
		b := setup(t, d, toolcall.Config{})
		b.ledger.before = func(context.Context) error {
			return outbox.PermanentBody(json.RawMessage(`{"code": "charge_already_refunded"}`), errors.New("declined"))
		}
		first := b.exec.Run(t.Context(), refund)[0]
		second := b.exec.Run(t.Context(), refund)[0]
		require.True(t, first.IsError())
		require.Equal(t, `{"status":"failed","key":"`+string(first.Result.Key)+`","failure":{"code": "charge_already_refunded"}}`, first.Text())
		require.Equal(t, first.Text(), second.Text())
	})

	t.Run("DispatchedWaitsForTheDispatcher", func(t *testing.T) {
		t.Parallel()
		b := setup(t, d, toolcall.Config{Mode: toolcall.Dispatched})
		runDispatcher(t, b.client)
		outs := b.exec.Run(t.Context(), refund, turn.Call(1, "call_2", "refund", `{"order": 8843, "amount": "7.50"}`))
		for _, out := range outs {
			require.Equal(t, outbox.ObservationSucceeded, out.Observation().Status, out.Text())
		}
		require.Equal(t, refund.Step+1, outs[1].Call.Step)
		require.Equal(t, 2, b.ledger.refunds(t))
	})

	t.Run("DispatchedPastTheWaitReadsInProgress", func(t *testing.T) {
		t.Parallel()
		b := setup(t, d, toolcall.Config{Mode: toolcall.Dispatched, Wait: time.Millisecond})
		// No dispatcher runs: the call stays pending.
		out := b.exec.Run(t.Context(), refund)[0]
		obs := out.Observation()
		require.Equal(t, outbox.ObservationInProgress, obs.Status, out.Text())
		require.Positive(t, obs.RetryAfterMS)

		never, err := toolcall.NewExecutor(b.client, toolcall.Config{Mode: toolcall.Dispatched, Wait: -1})
		require.NoError(t, err)
		out = never.Run(t.Context(), refund)[0]
		require.NoError(t, out.Err)
		require.Equal(t, outbox.ObservationInProgress, out.Observation().Status)
		require.Equal(t, int64(0), b.ledger.calls.Load())
	})

	t.Run("SubmitTxBesideTheRuntimesRecord", func(t *testing.T) {
		t.Parallel()
		b := setup(t, d, toolcall.Config{})
		pool := pgoncetest.Pool(t)
		turns := pgx.Identifier{b.schema, "turns"}.Sanitize()
		_, err := pool.Exec(t.Context(), `CREATE TABLE `+turns+` (run_id text, first_step bigint, message text)`)
		require.NoError(t, err)
		calls := []toolcall.Call{
			refund,
			turn.Call(1, "call_2", "refund", `{"order": 8843,`),
			turn.Call(2, "call_3", "wire_money", `{}`),
		}
		record := func(tx TTx) error {
			// The runtime's own row, in the driver's transaction.
			return execTx(t.Context(), tx, `INSERT INTO `+turns+` VALUES ('run-8842', 3, 'refund twice, then wire')`)
		}

		// Rolled back: neither the record nor the claims exist.
		errRollback := errors.New("rollback")
		err = d.InTx(t, t.Context(), func(tx TTx) error {
			require.NoError(t, record(tx))
			_, err := b.exec.SubmitTx(t.Context(), tx, calls...)
			require.NoError(t, err)
			return errRollback
		})
		require.ErrorIs(t, err, errRollback)
		page, err := b.client.List(t.Context(), outbox.ListParams{})
		require.NoError(t, err)
		require.Empty(t, page.Keys)

		var submitted []toolcall.Outcome
		require.NoError(t, d.InTx(t, t.Context(), func(tx TTx) error {
			if err := record(tx); err != nil {
				return err
			}
			var err error
			submitted, err = b.exec.SubmitTx(t.Context(), tx, calls...)
			return err // refused calls leave the transaction usable
		}))
		require.Equal(t, outbox.ObservationInProgress, submitted[0].Observation().Status)
		require.Equal(t, outbox.ObservationInvalidArguments, submitted[1].Observation().Status)
		require.Equal(t, outbox.ObservationUnknownTool, submitted[2].Observation().Status)
		var n int
		require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM `+turns).Scan(&n))
		require.Equal(t, 1, n)

		outs := b.exec.Run(t.Context(), calls...)
		require.Equal(t, outbox.ObservationSucceeded, outs[0].Observation().Status, outs[0].Text())
		require.Equal(t, submitted[0].Result.Key, outs[0].Result.Key)
		require.Equal(t, outbox.ObservationInvalidArguments, outs[1].Observation().Status)
		require.Equal(t, 1, b.ledger.refunds(t))
	})

	t.Run("TheCallersContextDoesNotCutAStartedCallOff", func(t *testing.T) {
		t.Parallel()
		b := setup(t, d, toolcall.Config{})
		// An at-most-once tool: cut off, its attempt would be uncertain and
		// go to review.
		ctx, cancel := context.WithCancel(t.Context())
		require.NoError(t, b.registry.Register("charge", outbox.ProviderFunc(func(pctx context.Context, req outbox.Request) (json.RawMessage, error) {
			cancel() // the runtime gives up while the provider runs
			if err := pctx.Err(); err != nil {
				return nil, err
			}
			return json.RawMessage(`{"charge_id": "ch_1"}`), nil
		}), outbox.AtMostOnce))
		out := b.exec.Run(ctx, turn.Call(0, "call_1", "charge", `{"amount": "5.00"}`))[0]
		require.NoError(t, out.Err)
		require.Equal(t, outbox.ObservationSucceeded, out.Observation().Status, out.Text())

		// A call not started yet is not claimed at all.
		out = b.exec.Run(ctx, refund)[0]
		require.ErrorIs(t, out.Err, context.Canceled)
		require.Equal(t, outbox.ObservationUnavailable, out.Observation().Status)
		require.Equal(t, int64(0), b.ledger.calls.Load())
	})

	t.Run("CrashAfterTheProviderActedThenRestart", func(t *testing.T) {
		t.Parallel()
		testCrash(t, d)
	})
}

// testCrash runs the refund in a process that dies after the provider acted
// and before anything was recorded; a new process, its lease expired and the
// reconciler run, asks again (the members re-ordered) and the model reads the
// one refund.
func testCrash[TTx any](t *testing.T, d drivertest.Driver[TTx]) {
	t.Helper()
	turn := toolcall.Turn{RunID: "run-8842", FirstStep: 3}
	schema := pgoncetest.Schema(t)
	l := newLedger(t, schema)

	// The first process: its provider refunds, then hangs until the test
	// ends, as a process that died would never answer. Its lease is the
	// shortest its call timeout allows, so that it expires soon.
	acted := make(chan struct{})
	dead := make(chan struct{})
	var actedOnce sync.Once
	first := &ledger{pool: l.pool, table: l.table, detached: true, after: func(context.Context) error {
		actedOnce.Do(func() { close(acted) })
		<-dead
		return nil
	}}
	registry1 := outbox.NewRegistry()
	require.NoError(t, registry1.Register("refund", first, outbox.IdempotentByKey))
	client1 := d.Client(t, outbox.Config{
		Schema: schema, Registry: registry1,
		CallTimeout: 50 * time.Millisecond, Lease: 50*time.Millisecond + outbox.LeaseMarginMin,
	})
	exec1, err := toolcall.NewExecutor(client1, toolcall.Config{})
	require.NoError(t, err)
	crashed := make(chan struct{})
	go func() {
		defer close(crashed)
		exec1.Run(context.WithoutCancel(t.Context()), turn.Call(0, "call_1", "refund", `{"order": 8842, "amount": "42.00"}`))
	}()
	t.Cleanup(func() {
		close(dead)
		<-crashed
	})
	select {
	case <-acted:
	case <-crashed:
		t.Fatal("the crashed process ended before its provider acted")
	}
	require.Equal(t, 1, l.refunds(t))

	// The new process.
	registry2 := outbox.NewRegistry()
	require.NoError(t, registry2.Register("refund", l, outbox.IdempotentByKey))
	client2 := d.Client(t, outbox.Config{Schema: schema, Registry: registry2})
	exec2, err := toolcall.NewExecutor(client2, toolcall.Config{Wait: -1})
	require.NoError(t, err)
	reask := turn.Call(0, "call_2", "refund", `{"amount": "42.00", "order": 8842}`)

	// Before the lease expires, the re-ask reads in progress.
	out := exec2.Run(t.Context(), reask)[0]
	require.Equal(t, outbox.ObservationInProgress, out.Observation().Status, out.Text())

	reconcileUntilResolved(t, client2)
	out = exec2.Run(t.Context(), reask)[0]
	require.NoError(t, out.Err)
	require.Equal(t, `{"status":"succeeded","key":"`+string(out.Result.Key)+`","response":{"refund_id": "re_1",  "amount": "42.00"}}`, out.Text())
	again := exec2.Run(t.Context(), reask)[0]
	require.Equal(t, out.Text(), again.Text())
	require.Equal(t, 1, l.refunds(t), "one refund, whatever the crash")
}

// reconcileUntilResolved runs the reconciler over client until it has
// resolved an expired lease: the crashed attempt's, once it expires.
func reconcileUntilResolved[TTx any](t *testing.T, client *outbox.Client[TTx]) {
	t.Helper()
	r, err := reconcile.New(client, reconcile.Config{Grace: time.Millisecond, PruneDisabled: true})
	require.NoError(t, err)
	for {
		report, err := r.RunOnce(t.Context())
		require.NoError(t, err)
		if len(report.Examined) > 0 {
			return
		}
		select {
		case <-t.Context().Done():
			t.Fatal("the crashed attempt's lease never expired")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitInFlight waits until the action is in flight.
func waitInFlight[TTx any](t *testing.T, client *outbox.Client[TTx]) {
	t.Helper()
	for {
		page, err := client.List(t.Context(), outbox.ListParams{States: []outbox.State{outbox.StateInFlight}})
		require.NoError(t, err)
		if len(page.Keys) == 1 {
			return
		}
		select {
		case <-t.Context().Done():
			t.Fatal("the action never went in flight")
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func runDispatcher[TTx any](t *testing.T, client *outbox.Client[TTx]) {
	t.Helper()
	disp, err := dispatcher.New(client, dispatcher.Config{})
	require.NoError(t, err)
	ctx, stop := context.WithCancel(context.WithoutCancel(t.Context()))
	ran := make(chan error, 1)
	go func() { ran <- disp.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		require.NoError(t, <-ran)
	})
}

func execTx(ctx context.Context, tx any, stmt string) error {
	switch tx := tx.(type) {
	case pgx.Tx:
		_, err := tx.Exec(ctx, stmt)
		return err
	case *sql.Tx:
		_, err := tx.ExecContext(ctx, stmt)
		return err
	default:
		return fmt.Errorf("unknown transaction type %T", tx)
	}
}
