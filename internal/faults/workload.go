package faults

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/store"
	"github.com/pgonce/pgonce/outbox"
)

// NewPool returns a pool over url whose connections carry applicationName
// (so that a backend killer can find them) and an empty search_path (so that
// a statement that forgets its schema fails), of 16 connections unless url
// sets pool_max_conns.
func NewPool(ctx context.Context, url, applicationName string) (*pgxpool.Pool, error) {
	config, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	config.ConnConfig.RuntimeParams["search_path"] = ""
	config.ConnConfig.RuntimeParams["application_name"] = applicationName
	config.ConnConfig.ConnectTimeout = 5 * time.Second
	if !strings.Contains(url, "pool_max_conns=") {
		config.MaxConns = 16
	}
	return pgxpool.NewWithConfig(ctx, config)
}

// NewDB returns a database/sql pool over url, opened with pgx's stdlib
// driver, whose connections carry applicationName and an empty search_path,
// as [NewPool]'s do. database/sql, not pgxpool, manages its connections.
func NewDB(url, applicationName string) (*sql.DB, error) {
	config, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	config.RuntimeParams["search_path"] = ""
	config.RuntimeParams["application_name"] = applicationName
	config.ConnectTimeout = 5 * time.Second
	db := stdlib.OpenDB(*config)
	db.SetMaxOpenConns(16)
	return db, nil
}

// Tx is a transaction the workload submits in, of either driver.
type Tx interface {
	SubmitTx(ctx context.Context, call outbox.Call) (outbox.Result, error)
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// Submitter is a client as the workload uses it, whatever its driver: see
// [PgxSubmitter] and [StdSubmitter].
type Submitter interface {
	// Begin begins a transaction on the client's database.
	Begin(ctx context.Context) (Tx, error)
	// Submit is [outbox.Client.Submit].
	Submit(ctx context.Context, call outbox.Call) (outbox.Result, error)
	// Do is [outbox.Client.Do] with the tool's registered provider.
	Do(ctx context.Context, call outbox.Call) (outbox.Result, error)
}

// PgxSubmitter submits through client in transactions of pool.
func PgxSubmitter(client *outbox.Client[pgx.Tx], pool *pgxpool.Pool) Submitter {
	return pgxSubmitter{client: client, pool: pool}
}

type pgxSubmitter struct {
	client *outbox.Client[pgx.Tx]
	pool   *pgxpool.Pool
}

func (s pgxSubmitter) Begin(ctx context.Context) (Tx, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return pgxTx{client: s.client, tx: tx}, nil
}

func (s pgxSubmitter) Submit(ctx context.Context, call outbox.Call) (outbox.Result, error) {
	return s.client.Submit(ctx, call)
}

func (s pgxSubmitter) Do(ctx context.Context, call outbox.Call) (outbox.Result, error) {
	return s.client.Do(ctx, call, nil)
}

type pgxTx struct {
	client *outbox.Client[pgx.Tx]
	tx     pgx.Tx
}

func (t pgxTx) SubmitTx(ctx context.Context, call outbox.Call) (outbox.Result, error) {
	return t.client.SubmitTx(ctx, t.tx, call)
}
func (t pgxTx) Commit(ctx context.Context) error   { return t.tx.Commit(ctx) }
func (t pgxTx) Rollback(ctx context.Context) error { return t.tx.Rollback(ctx) }

// StdSubmitter submits through client in *sql.Tx transactions of db.
func StdSubmitter(client *outbox.Client[*sql.Tx], db *sql.DB) Submitter {
	return stdSubmitter{client: client, db: db}
}

type stdSubmitter struct {
	client *outbox.Client[*sql.Tx]
	db     *sql.DB
}

func (s stdSubmitter) Begin(ctx context.Context) (Tx, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	return stdTx{client: s.client, tx: tx}, nil
}

func (s stdSubmitter) Submit(ctx context.Context, call outbox.Call) (outbox.Result, error) {
	return s.client.Submit(ctx, call)
}

func (s stdSubmitter) Do(ctx context.Context, call outbox.Call) (outbox.Result, error) {
	return s.client.Do(ctx, call, nil)
}

type stdTx struct {
	client *outbox.Client[*sql.Tx]
	tx     *sql.Tx
}

func (t stdTx) SubmitTx(ctx context.Context, call outbox.Call) (outbox.Result, error) {
	return t.client.SubmitTx(ctx, t.tx, call)
}

// Commit and Rollback: a *sql.Tx runs them under the context it began with,
// so the workload's bound on a rollback does not apply (a black hole could
// hold one; the database/sql campaigns cut and kill, which end it).
func (t stdTx) Commit(context.Context) error   { return t.tx.Commit() }
func (t stdTx) Rollback(context.Context) error { return t.tx.Rollback() }

// Workload submits ledger calls, each in a transaction of its own, and
// records every call and its fate in History. With DoAsks set, it runs
// them inline with Do instead.
type Workload struct {
	// Client submits, in transactions of its own database.
	Client Submitter
	// History records every call.
	History *History
	// RunID names the campaign's calls; steps count from 0.
	RunID string
	// RollbackEvery rolls back every n-th transaction. Zero never does.
	RollbackEvery int
	// RetryTimeout bounds how long a call whose COMMIT went unanswered is
	// asked again, as a caller would, until an answer says it exists.
	// Defaults to 30s.
	RetryTimeout time.Duration
	// DoAsks, when positive, makes [Workload.Run] run each call inline with
	// Do instead of submitting it, asked by 1 to DoAsks concurrent callers
	// (duplicate asks of one action).
	DoAsks int

	step   atomic.Int64
	errors atomic.Int64
	asks   atomic.Int64
}

// Asks counts the Dos the workload ran.
func (w *Workload) Asks() int { return int(w.asks.Load()) }

// Errors counts the submits that failed (and so rolled back).
func (w *Workload) Errors() int { return int(w.errors.Load()) }

// call returns the step-th call of the workload.
func (w *Workload) call(step int64) outbox.Call {
	tool := Tools[step%int64(len(Tools))]
	return outbox.Call{
		RunID:     w.RunID,
		Step:      step,
		Tool:      tool,
		NaturalID: fmt.Sprintf("%s-%d", w.RunID, step),
		Args:      map[string]any{"step": step, "amount": fmt.Sprintf("%d.00", step%97)},
	}
}

// SubmitOne submits the next call in a transaction of its own, and returns
// its key and fate.
func (w *Workload) SubmitOne(ctx context.Context) (outbox.Key, Fate) {
	step := w.step.Add(1) - 1
	call := w.call(step)
	key, err := outbox.DeriveKey(call)
	if err != nil {
		panic(fmt.Sprintf("faults: derive key: %v", err)) // the workload's calls are valid
	}
	fate := w.submit(ctx, call, step)
	w.History.Add(call, key, fate)
	return key, fate
}

// submitAskTimeout bounds each ask of the retry of a submit whose COMMIT
// went unanswered.
const submitAskTimeout = 2 * time.Second

func (w *Workload) submit(ctx context.Context, call outbox.Call, step int64) Fate {
	tx, err := w.Client.Begin(ctx)
	if err != nil {
		w.errors.Add(1)
		return FateRolledBack
	}
	rollback := func() {
		// Bounded: the connection may be dead in a black hole.
		rbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tx.Rollback(rbCtx)
	}
	if _, err := tx.SubmitTx(ctx, call); err != nil {
		w.errors.Add(1)
		rollback()
		return FateRolledBack
	}
	if w.RollbackEvery > 0 && step%int64(w.RollbackEvery) == 0 {
		rollback()
		return FateRolledBack
	}
	if err := tx.Commit(ctx); err == nil {
		return FateCommitted
	}
	// The COMMIT may or may not have happened: ask again, as a caller who
	// never heard back does. The same call derives the same key, so the
	// retry can never act twice.
	retryCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cmpOr(w.RetryTimeout, 30*time.Second))
	defer cancel()
	for delay := 10 * time.Millisecond; ; delay = min(2*delay, time.Second) {
		// Each ask under a deadline of its own, as a caller's request has:
		// an idle connection that died in a black hole answers nothing, and
		// is dropped when its ask's deadline passes, instead of holding
		// the whole retry.
		askCtx, cancelAsk := context.WithTimeout(retryCtx, submitAskTimeout)
		_, err := w.Client.Submit(askCtx, call)
		cancelAsk()
		if err == nil {
			return FateCommitted
		}
		select {
		case <-retryCtx.Done():
			return FateUnknown
		case <-time.After(delay):
		}
	}
}

// DoOne runs the next call inline with Do, asked by asks concurrent
// callers, and returns its key and fate. Each caller asks again, as a
// caller who never heard back does, until an answer says the key exists:
// an outcome, [outbox.ErrInProgress] or [outbox.ErrProviderFailed] (both
// leave the key to a dispatcher). Succeeded answers are recorded with
// [History.Observe].
func (w *Workload) DoOne(ctx context.Context, asks int) (outbox.Key, Fate) {
	step := w.step.Add(1) - 1
	call := w.call(step)
	key, err := outbox.DeriveKey(call)
	if err != nil {
		panic(fmt.Sprintf("faults: derive key: %v", err)) // the workload's calls are valid
	}
	var exists atomic.Bool
	var wg sync.WaitGroup
	for range asks {
		wg.Go(func() {
			if w.ask(ctx, call, key) {
				exists.Store(true)
			}
		})
	}
	wg.Wait()
	fate := FateUnknown
	if exists.Load() {
		fate = FateCommitted
	}
	w.History.Add(call, key, fate)
	return key, fate
}

// ask runs call with Do until an answer says its key exists, or the retry
// timeout passes; it reports whether one did.
func (w *Workload) ask(ctx context.Context, call outbox.Call, key outbox.Key) bool {
	retryCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cmpOr(w.RetryTimeout, 30*time.Second))
	defer cancel()
	for delay := 10 * time.Millisecond; ; delay = min(2*delay, time.Second) {
		w.asks.Add(1)
		res, err := w.Client.Do(retryCtx, call)
		switch {
		case err == nil:
			if res.State == outbox.StateSucceeded {
				w.History.Observe(key, res.Response)
			}
			return true
		case errors.Is(err, outbox.ErrInProgress), errors.Is(err, outbox.ErrProviderFailed), res.State != "":
			// The key exists (a record that failed returns the claim's
			// result): a dispatcher or the reconciler finishes it.
			return true
		}
		w.errors.Add(1)
		select {
		case <-retryCtx.Done():
			return false
		case <-time.After(delay):
		}
	}
}

// Run submits calls from workers goroutines until ctx is done or max calls
// were submitted (0: no limit), pausing pause between the calls of each.
func (w *Workload) Run(ctx context.Context, workers, maxCalls int, pause time.Duration) {
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				if maxCalls > 0 && w.step.Load() >= int64(maxCalls) {
					return
				}
				if w.DoAsks > 0 {
					w.DoOne(ctx, 1+mathrand.IntN(w.DoAsks))
				} else {
					w.SubmitOne(ctx)
				}
				if pause > 0 {
					select {
					case <-ctx.Done():
					case <-time.After(pause):
					}
				}
			}
		})
	}
	wg.Wait()
}

func cmpOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// AwaitTerminal polls schema until none of keys is pending or in flight, or
// ctx is done, and returns how many are still open then.
func AwaitTerminal(ctx context.Context, pool *pgxpool.Pool, schema string, keys []outbox.Key) (int, error) {
	list := make([]string, len(keys))
	for i, key := range keys {
		list[i] = string(key)
	}
	open := -1
	for {
		err := pool.QueryRow(ctx, `SELECT count(*) FROM `+ident.Quote(schema)+`.pgonce_key
			WHERE state = 'open' AND key IN (SELECT decode(substr(k, 4), 'hex') FROM unnest($1::text[]) AS k)`, list).Scan(&open)
		if err == nil && open == 0 {
			return 0, nil
		}
		select {
		case <-ctx.Done():
			if err != nil && !store.IsTransient(err) {
				return open, err
			}
			return open, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Tally adds up what a test binary's campaigns did, for the summary line. It
// is safe for concurrent use.
type Tally struct {
	mu     sync.Mutex
	calls  int
	rolled int
	faults map[string]int
	report Report
	asks   int
	waits  int
	// waitErrors counts waits that ended without the terminal result while
	// their context was live: a violation.
	waitErrors int
}

// Asks counts n Dos of callers.
func (t *Tally) Asks(n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.asks += n
}

// Waits counts n waits, failed of which did not return the terminal result.
func (t *Tally) Waits(n, failed int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.waits += n
	t.waitErrors += failed
}

// Fault counts one injected fault of kind.
func (t *Tally) Fault(kind string) { t.Faults(kind, 1) }

// Faults counts n injected faults of kind.
func (t *Tally) Faults(kind string, n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.faults == nil {
		t.faults = map[string]int{}
	}
	t.faults[kind] += n
}

// Add counts a campaign's checked history.
func (t *Tally) Add(r *Report) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.calls += r.Calls
	t.rolled += r.RolledBack
	t.report.Duplicates += r.Duplicates
	t.report.Lost += r.Lost
	t.report.Dropped += r.Dropped
	t.report.Mismatched += r.Mismatched
	t.report.Unfinished += r.Unfinished
	t.report.NeedlessReview += r.NeedlessReview
	t.report.Phantom += r.Phantom
}

// Summary returns the summary line:
//
//	faults: calls=N rolled_back=N do_asks=N waits=N faults{kind=N ...} duplicates=0 lost=0 dropped=0 ... wait_errors=0
func (t *Tally) Summary() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	kinds := make([]string, 0, len(t.faults))
	for kind := range t.faults {
		kinds = append(kinds, kind)
	}
	sort.Strings(kinds)
	parts := make([]string, len(kinds))
	for i, kind := range kinds {
		parts[i] = fmt.Sprintf("%s=%d", kind, t.faults[kind])
	}
	r := t.report
	return fmt.Sprintf("faults: calls=%d rolled_back=%d do_asks=%d waits=%d faults{%s} duplicates=%d lost=%d dropped=%d "+
		"mismatched=%d unfinished=%d needless_review=%d phantom=%d wait_errors=%d",
		t.calls, t.rolled, t.asks, t.waits, strings.Join(parts, " "), r.Duplicates, r.Lost, r.Dropped,
		r.Mismatched, r.Unfinished, r.NeedlessReview, r.Phantom, t.waitErrors)
}
