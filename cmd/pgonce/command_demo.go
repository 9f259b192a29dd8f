package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/migrations"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/reconcile"
	"github.com/pgonce/pgonce/telemetry"
)

// The demo's timings. The story holds by conditions, not by timing: the
// provider's first call waits until the demo has asked again (step 2), so
// its call timeout only bounds a broken story, however busy the machine.
// The demo does not wait out the crashed attempt's lease either: in step 4
// it moves its clock ([outbox.Config.NowFunc]) past it.
const (
	// demoStepTimeout bounds every wait, so that a broken invariant ends
	// the demo instead of hanging it.
	demoStepTimeout = time.Minute
	demoCallTimeout = demoStepTimeout
	demoLease       = demoCallTimeout + outbox.LeaseMarginMin
)

// demoClock is the demo's clock: the machine's, moved forward by what
// [demoClock.advance] added.
type demoClock struct{ ahead atomic.Int64 }

func (c *demoClock) now() time.Time { return time.Now().Add(time.Duration(c.ahead.Load())) }

func (c *demoClock) advance(d time.Duration) { c.ahead.Add(int64(d)) }

func demoCommand() *command {
	return &command{
		name:     "demo",
		synopsis: "demo [--keep] [--trace]",
		summary:  "the refund story end to end, in a throw-away schema",
		// The demo makes a schema of its own.
		noSchema: true,
		help: `Runs the refund story of pgonce's design on the database, in about a second
and a half: a model asks for refund(order=8842, amount="42.00") three times
around a lost response and a crashed worker; a fake payment provider that
honours idempotency keys refunds exactly once. Then the model re-plans the
same step with another amount (a conflict: nothing runs), and a mail whose
outcome nobody knows goes to needs review and is resolved by an operator.

The demo migrates a fresh schema pgonce_demo_<random> and drops it at the
end unless --keep. It exits 1 if any invariant
fails: one refund in the ledger, the replay byte for byte, the states.

With --trace it then prints the refund's trace, as package telemetry makes
it: the model's asks, their submits, the provider calls, the dispatchers'
claim and record batches (linked to the submit), and the reconcile run.`,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			keep := fs.Bool("keep", false, "keep the demo schema and print its name")
			traced := fs.Bool("trace", false, "print the refund's trace at the end")
			return func(ctx context.Context, args []string) error {
				if len(args) != 0 {
					return usageErrorf("takes no arguments, got %q", args)
				}
				return e.demo(ctx, *keep, *traced)
			}
		},
	}
}

func invariant(format string, args ...any) error {
	return &exitError{code: exitFailure, msg: "invariant broken: " + fmt.Sprintf(format, args...)}
}

// await waits for ch, or fails the demo after demoStepTimeout.
func await(ctx context.Context, ch <-chan struct{}, what string) error {
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(demoStepTimeout):
		return invariant("%s did not happen within %s", what, demoStepTimeout)
	}
}

func (e *env) demo(ctx context.Context, keep, traced bool) (err error) {
	c, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	var suffix [6]byte
	_, _ = rand.Read(suffix[:])
	c.schema = "pgonce_demo_" + hex.EncodeToString(suffix[:])
	quoted := pgx.Identifier{c.schema}.Sanitize()
	defer func() {
		if keep {
			fmt.Fprintf(e.stdout, "\nkept schema %s; drop it with: DROP SCHEMA %s CASCADE\n", c.schema, quoted)
			return
		}
		dropCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), demoStepTimeout)
		defer cancel()
		if _, dropErr := c.pool.Exec(dropCtx, "DROP SCHEMA IF EXISTS "+quoted+" CASCADE"); dropErr != nil && err == nil {
			err = fmt.Errorf("drop demo schema %s: %w", c.schema, dropErr)
		}
	}()
	if err := migrations.Up(ctx, c.db, c.schema); err != nil {
		return err
	}
	payments := &demoPayments{
		pool:    c.pool,
		ledger:  pgx.Identifier{c.schema, "refund_ledger"}.Sanitize(),
		called:  make(chan struct{}, 1),
		proceed: make(chan struct{}),
		acted:   make(chan struct{}, 1),
	}
	payments.lossy.Store(true)
	if _, err := c.pool.Exec(ctx, `CREATE TABLE `+payments.ledger+` (
		id bigserial PRIMARY KEY,
		idempotency_key text NOT NULL UNIQUE,
		order_id bigint NOT NULL,
		amount numeric(12, 2) NOT NULL
	)`); err != nil {
		return fmt.Errorf("create the demo ledger: %w", err)
	}
	quiet := slog.New(slog.DiscardHandler)
	registry := outbox.NewRegistry()
	if err := registry.Register("refund", payments, outbox.IdempotentByKey); err != nil {
		return err
	}
	if err := registry.Register("notify", demoMailer{}, outbox.AtMostOnce); err != nil {
		return err
	}
	clock := &demoClock{}
	config := outbox.Config{
		Registry: registry, CallTimeout: demoCallTimeout, Lease: demoLease, Logger: quiet,
		NowFunc: clock.now,
	}
	var tr *demoTracing
	if traced {
		if tr, err = newDemoTracing(ctx); err != nil {
			return err
		}
		config.Middleware = []outbox.Middleware{tr.tel}
	}
	client, err := c.client(config)
	if err != nil {
		return err
	}
	if err := runDemo(ctx, e, c, client, payments, clock, quiet, tr); err != nil {
		return err
	}
	if tr != nil {
		tr.root.End()
		fmt.Fprintln(e.stdout, "")
		fmt.Fprintln(e.stdout, "The refund's trace: each span under its parent; a dispatcher's batches, in traces of")
		fmt.Fprintln(e.stdout, "their own, under the submit they link to.")
		fmt.Fprintln(e.stdout, "")
		printTrace(e.stdout, tr.recorder.spans(), tr.root)
	}
	return nil
}

// submit asks for call in a transaction of the caller's, as an agent
// runtime would.
func submit(ctx context.Context, c *conn, client *outbox.Client[pgx.Tx], tr *demoTracing, call outbox.Call) (outbox.Result, error) {
	tx, err := c.pool.Begin(ctx)
	if err != nil {
		return outbox.Result{}, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	submitTx := client.SubmitTx
	if tr != nil {
		submitTx = telemetry.Traced(client, tr.tel).SubmitTx
	}
	res, err := submitTx(ctx, tx, call)
	if err != nil {
		return outbox.Result{}, err
	}
	return res, tx.Commit(ctx)
}

func runDemo(ctx context.Context, e *env, c *conn, client *outbox.Client[pgx.Tx], payments *demoPayments, clock *demoClock,
	quiet *slog.Logger, tr *demoTracing,
) error {
	say := func(format string, args ...any) { fmt.Fprintf(e.stdout, format+"\n", args...) }
	refunds := func() (int, error) {
		rows, err := payments.rows(ctx)
		return len(rows), err
	}
	dispatcherConfig := dispatcher.Config{
		Concurrency:     1,
		PollInterval:    20 * time.Millisecond,
		ShutdownTimeout: demoStepTimeout,
		// The demo runs its reconciler itself, in step 4, to show it.
		MaintenanceDisabled: true,
		Logger:              quiet,
	}

	say("pgonce demo: ask twice, execute once")
	say("")
	say(`A fake payment provider is registered as tool "refund", IdempotentByKey:`)
	say("it records refunds in a ledger and deduplicates on the idempotency key pgonce passes.")
	say("")

	// 1. The first ask.
	call := outbox.Call{
		Tenant: "acme",
		RunID:  "run-8842",
		Step:   1,
		Tool:   "refund",
		// Money as a decimal string, never a JSON number: the canonical
		// form keeps a string as written, so "42.00" stays exact.
		Args: json.RawMessage(`{"order": 8842, "amount": "42.00"}`),
	}
	canonical, err := outbox.Canonicalize(call.Args)
	if err != nil {
		return err
	}
	key, err := outbox.DeriveKey(call)
	if err != nil {
		return err
	}
	askCtx, asked := tr.ask(ctx)
	res, err := submit(askCtx, c, client, tr, call)
	asked()
	if err != nil {
		return err
	}
	say(`1. The model emits refund(order=8842, amount="42.00"), the amount a decimal string.`)
	say("   arguments as written:  %s", call.Args)
	say("   canonical (RFC 8785):  %s", canonical)
	say("   key:                   %s", key)
	say("   SubmitTx wrote the key claim, its own outbox entry, in the caller's transaction, then it committed.")
	say("   created=%t state=%s", res.Created, res.State)
	if !res.Created || res.State != outbox.StatePending || res.Key != key {
		return invariant("the first ask must create key %s pending, got created=%t state=%s key=%s", key, res.Created, res.State, res.Key)
	}

	// A dispatcher takes the row; the provider's first call starts. Its
	// shutdown cancels calls at once, which is the crash of step 3: stopped,
	// it cuts the call off before anything is recorded (its documented
	// behaviour), so the row stays in flight under its lease.
	crashing := dispatcherConfig
	crashing.ShutdownTimeout = -1
	d1, err := dispatcher.New(client, crashing)
	if err != nil {
		return err
	}
	crashCtx, crash := context.WithCancel(untraced(ctx))
	defer crash()
	d1Done := make(chan struct{})
	go func() {
		defer close(d1Done)
		_ = d1.Run(crashCtx)
	}()
	if err := await(ctx, payments.called, "the dispatcher's call to the provider"); err != nil {
		return err
	}

	// 2. The duplicate, while the call is in flight.
	again := call
	again.Args = json.RawMessage(`{"amount":"42.00",  "order":8842}`)
	askCtx, asked = tr.ask(ctx)
	res, err = submit(askCtx, c, client, tr, again)
	asked()
	if err != nil {
		return err
	}
	n, err := refunds()
	if err != nil {
		return err
	}
	say("")
	say("2. A dispatcher has claimed the row and is calling the provider. The model asks again:")
	say("   arguments as written:  %s  (other order and spacing, same canonical value, so the same key)", again.Args)
	say("   key:                   %s", res.Key)
	say("   created=%t state=%s: in progress, retry later; nothing new runs.", res.Created, res.State)
	say("   observation: %s", maskObservation(res.Observation().JSON()))
	say("   (retry_after_ms is what is left of the lease; masked, as it depends on the clock)")
	say("   provider calls so far: %d, refunds in the ledger: %d", payments.calls.Load(), n)
	if res.Created || res.State != outbox.StateInFlight || res.Key != key || payments.calls.Load() != 1 || n != 0 {
		return invariant("the duplicate must find key %s in flight and run nothing, got created=%t state=%s key=%s calls=%d refunds=%d",
			key, res.Created, res.State, res.Key, payments.calls.Load(), n)
	}

	// 3. The provider acts, the response is lost, the worker crashes.
	close(payments.proceed)
	if err := await(ctx, payments.acted, "the provider's refund"); err != nil {
		return err
	}
	crash()
	if err := await(ctx, d1Done, "the crashed worker's exit"); err != nil {
		return err
	}
	res, err = client.Get(ctx, key)
	if err != nil {
		return err
	}
	n, err = refunds()
	if err != nil {
		return err
	}
	say("")
	say("3. The provider refunds 42.00 on order 8842, but its response is lost on the way back")
	say("   (an ambiguous timeout), and the worker crashes before it can record anything.")
	say("   refunds in the ledger: %d", n)
	say("   state=%s: nobody knows whether the refund happened, and the lease still holds the key.", res.State)
	if res.State != outbox.StateInFlight || n != 1 {
		return invariant("after the crash the key must be in flight with one refund, got state=%s refunds=%d", res.State, n)
	}
	return demoRecover(ctx, e, client, payments, clock, key, call, dispatcherConfig, quiet, tr)
}

func demoRecover(ctx context.Context, e *env, client *outbox.Client[pgx.Tx], payments *demoPayments, clock *demoClock,
	key outbox.Key, call outbox.Call, dispatcherConfig dispatcher.Config, quiet *slog.Logger, tr *demoTracing,
) error {
	say := func(format string, args ...any) { fmt.Fprintf(e.stdout, format+"\n", args...) }
	deadline, cancel := context.WithTimeout(ctx, demoStepTimeout)
	defer cancel()

	// 4. The lease expires; the reconciler resolves the row; a fresh
	// dispatcher retries with the same key. Rather than wait out the
	// lease, the demo's clock moves past it; every statement of the
	// client, the reconciler and the dispatchers reads that clock.
	clock.advance(demoLease + time.Second)
	for {
		stats, err := client.Stats(deadline)
		if err != nil {
			return err
		}
		if stats.ExpiredLeases > 0 {
			break
		}
		if err := pause(deadline, 20*time.Millisecond); err != nil {
			return invariant("the crashed attempt's lease did not expire: %v", err)
		}
	}
	r, err := reconcile.New(client, reconcile.Config{Grace: time.Millisecond, PruneDisabled: true, Logger: quiet})
	if err != nil {
		return err
	}
	var report reconcile.Report
	for {
		// The grace is one millisecond past the lease, by the demo's
		// clock; a pass that comes too early finds nothing and changes
		// nothing.
		report, err = r.RunOnce(tr.within(deadline))
		if err != nil {
			return err
		}
		if report.Examined["refund"] > 0 {
			break
		}
		if err := pause(deadline, 5*time.Millisecond); err != nil {
			return invariant("the reconciler found no expired row: %v", err)
		}
	}
	res, err := client.Get(ctx, key)
	if err != nil {
		return err
	}
	say("")
	say("4. The lease expires. The reconciler resolves the stale row by the tool's delivery mode:")
	say("   refund is IdempotentByKey, so the row is %s: examined %d, requeued %d.",
		res.State, report.Examined["refund"], report.Resolved["refund"][reconcile.OutcomeRequeued])
	if res.State != outbox.StatePending || report.Examined["refund"] != 1 || report.Resolved["refund"][reconcile.OutcomeRequeued] != 1 {
		return invariant("the reconciler must requeue the one stale row, got state=%s report=%+v", res.State, report)
	}

	d2, err := dispatcher.New(client, dispatcherConfig)
	if err != nil {
		return err
	}
	stop, stopDispatcher := context.WithCancel(untraced(ctx))
	defer stopDispatcher()
	d2Done := make(chan struct{})
	go func() {
		defer close(d2Done)
		_ = d2.Run(stop)
	}()
	res, err = client.Wait(deadline, key)
	stopDispatcher()
	<-d2Done
	if err != nil {
		return invariant("the retry did not finish: %v", err)
	}
	rows, err := payments.rows(ctx)
	if err != nil {
		return err
	}
	say("   A fresh dispatcher retries with the same key; the provider recognises it and refunds nothing:")
	say("   provider calls: %d, refunds in the ledger: %d", payments.calls.Load(), len(rows))
	say("   state=%s, response: %s", res.State, res.Response)
	// Effects, not calls: a keyed retry (after a record that failed, say)
	// may call the provider again, and refunds nothing.
	if res.State != outbox.StateSucceeded || len(rows) != 1 || !bytes.Equal(res.Response, payments.lost) {
		return invariant("the retry must succeed with the original refund's response, got state=%s calls=%d refunds=%d response=%s",
			res.State, payments.calls.Load(), len(rows), res.Response)
	}

	// 5. The third ask: the stored response, replayed.
	callsBefore := payments.calls.Load()
	askCtx, asked := tr.ask(ctx)
	if tr != nil {
		res, err = telemetry.Traced(client, tr.tel).Submit(askCtx, call)
	} else {
		res, err = client.Submit(ctx, call)
	}
	asked()
	if err != nil {
		return err
	}
	obs := res.Observation().JSON()
	replayedVerbatim := bytes.Equal(res.Response, payments.lost) && bytes.Contains(obs, payments.lost)
	say("")
	say("5. The model asks a third time, with the first arguments: the stored response is replayed.")
	say("   observation: %s", obs)
	say("   byte for byte the provider's original response: %t", replayedVerbatim)
	if !res.Replayed() || !replayedVerbatim || payments.calls.Load() != callsBefore {
		return invariant("the third ask must replay the stored bytes and call nothing, got replayed=%t verbatim=%t calls=%d, %d before",
			res.Replayed(), replayedVerbatim, payments.calls.Load(), callsBefore)
	}

	// 6. The ledger.
	rows, err = payments.rows(ctx)
	if err != nil {
		return err
	}
	say("")
	say("6. The ledger holds exactly one refund:")
	for _, row := range rows {
		say("   %s  order %d  amount %s  idempotency key %s", row.refundID, row.order, row.amount, row.key)
	}
	if len(rows) != 1 || rows[0].key != string(key) {
		return invariant("the ledger must hold one refund under key %s, got %d rows", key, len(rows))
	}
	if err := demoConflict(ctx, e, client, payments, call); err != nil {
		return err
	}
	if err := demoReview(ctx, e, client); err != nil {
		return err
	}
	say("")
	say("Refund asked 3 times, executed once; provider called %d times.", payments.calls.Load())
	return nil
}

// demoConflict is step 7: the same run and step asked again with other
// arguments is a conflict, not a second refund.
func demoConflict(ctx context.Context, e *env, client *outbox.Client[pgx.Tx], payments *demoPayments, call outbox.Call) error {
	say := func(format string, args ...any) { fmt.Fprintf(e.stdout, format+"\n", args...) }
	replanned := call
	replanned.Args = json.RawMessage(`{"order": 8842, "amount": "40.00"}`)
	calls := payments.calls.Load()
	_, err := client.Submit(ctx, replanned)
	var conflict *outbox.KeyConflictError
	if !errors.As(err, &conflict) {
		return invariant("the same step with other arguments must conflict, got %v", err)
	}
	n, err := payments.rows(ctx)
	if err != nil {
		return err
	}
	say("")
	say(`7. The model re-plans step 1 while asking again: refund(order=8842, amount="40.00").`)
	say("   One logical step is one action, so pgonce refuses: ErrKeyConflict, nothing written, nothing runs.")
	say("   existing key: %s (tool %s)", conflict.ExistingKey, conflict.ExistingTool)
	say("   provider calls: %d, refunds in the ledger: %d", payments.calls.Load(), len(n))
	if payments.calls.Load() != calls || len(n) != 1 {
		return invariant("a conflict must run nothing, got calls=%d refunds=%d", payments.calls.Load(), len(n))
	}
	return nil
}

// demoReview is step 8: a tool that can neither deduplicate nor be asked
// what happened goes to needs review after an ambiguous attempt, and an
// operator resolves it.
func demoReview(ctx context.Context, e *env, client *outbox.Client[pgx.Tx]) error {
	say := func(format string, args ...any) { fmt.Fprintf(e.stdout, format+"\n", args...) }
	call := outbox.Call{
		Tenant: "acme",
		RunID:  "run-8842",
		Step:   2,
		Tool:   "notify",
		Args:   json.RawMessage(`{"order": 8842, "template": "refund_issued"}`),
	}
	res, err := client.Do(ctx, call, demoMailer{})
	if err != nil {
		return err
	}
	say("")
	say(`8. Step 2 sends the customer a mail: tool "notify", AtMostOnce (the mailer takes no key and`)
	say("   cannot be asked what it sent). Its call times out after sending: nobody knows whether")
	say("   the mail went out, so pgonce never retries it blindly.")
	say("   state=%s, last error: %s", res.State, res.LastError)
	if res.State != outbox.StateNeedsReview {
		return invariant("an ambiguous AtMostOnce attempt must need review, got state=%s", res.State)
	}
	resolution := outbox.Resolution{
		Action:   outbox.ResolveSucceeded,
		Response: json.RawMessage(`{"sent": true}`),
		By:       "ops",
		Reason:   "the mail log shows delivery",
	}
	res, err = client.Resolve(ctx, res.Key, resolution)
	if err != nil {
		return err
	}
	say("   An operator checks the mail log and resolves it, as this command would:")
	say("     pgonce resolve %s --succeeded --response '%s' --reason '%s' --by %s",
		res.Key, resolution.Response, resolution.Reason, resolution.By)
	say("   state=%s", res.State)
	again, err := client.Submit(ctx, call)
	if err != nil {
		return err
	}
	say("   Asked again, step 2 replays the decision: %s", again.Observation().JSON())
	if again.State != outbox.StateSucceeded || !again.Replayed() || !bytes.Equal(again.Response, resolution.Response) {
		return invariant("the resolved key must replay the operator's response, got state=%s response=%s", again.State, again.Response)
	}
	return nil
}

// pause waits d, or returns ctx's error.
func pause(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}
