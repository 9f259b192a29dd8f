package faults

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/store"
	"github.com/pgonce/pgonce/outbox"
)

// NewPool returns a pool over url whose connections carry applicationName
// (so that a backend killer can find them) and an empty search_path (so that
// a statement that forgets its schema fails).
func NewPool(ctx context.Context, url, applicationName string) (*pgxpool.Pool, error) {
	config, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	config.ConnConfig.RuntimeParams["search_path"] = ""
	config.ConnConfig.RuntimeParams["application_name"] = applicationName
	config.ConnConfig.ConnectTimeout = 5 * time.Second
	config.MaxConns = 16
	return pgxpool.NewWithConfig(ctx, config)
}

// Workload submits ledger calls, each in a transaction of its own, and
// records every call and its fate in History.
type Workload struct {
	// Client submits; Pool begins the transactions it submits in.
	Client *outbox.Client[pgx.Tx]
	Pool   *pgxpool.Pool
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

	step   atomic.Int64
	errors atomic.Int64
}

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

func (w *Workload) submit(ctx context.Context, call outbox.Call, step int64) Fate {
	tx, err := w.Pool.Begin(ctx)
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
	if _, err := w.Client.SubmitTx(ctx, tx, call); err != nil {
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
		if _, err := w.Client.Submit(retryCtx, call); err == nil {
			return FateCommitted
		}
		select {
		case <-retryCtx.Done():
			return FateUnknown
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
				w.SubmitOne(ctx)
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
			WHERE state = 'open' AND key = ANY($1)`, list).Scan(&open)
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
//	faults: calls=N rolled_back=N faults{kind=N ...} duplicates=0 lost=0 dropped=0 ...
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
	return fmt.Sprintf("faults: calls=%d rolled_back=%d faults{%s} duplicates=%d lost=%d dropped=%d "+
		"mismatched=%d unfinished=%d needless_review=%d phantom=%d",
		t.calls, t.rolled, strings.Join(parts, " "), r.Duplicates, r.Lost, r.Dropped,
		r.Mismatched, r.Unfinished, r.NeedlessReview, r.Phantom)
}
