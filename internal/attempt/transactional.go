package attempt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgonce/pgonce/internal/store"
)

// ErrTxTimeout is the error of an attempt of a transactional tool whose
// transaction hit a statement or lock timeout, or whose provider held it
// past the call timeout: the transaction was rolled back, effect included,
// and the key is tried again. outbox exports it as outbox.ErrTxTimeout.
var ErrTxTimeout = errors.New("transactional tool: statement or lock timeout, or the provider held the transaction past the call timeout; rolled back")

// ErrTxClosed is the error of an attempt of a transactional tool whose
// provider committed or rolled back the transaction itself: its effect may
// have committed without its outcome, so the key goes to review. outbox
// exports it as outbox.ErrTxClosed.
var ErrTxClosed = errors.New("transactional tool: the provider committed or rolled back the transaction itself")

// Tx is the transaction of one attempt of a transactional tool, opened by
// [Tool.Begin]. Package outbox implements it over the client's transaction
// type.
type Tx interface {
	// Call runs the tool's provider in the transaction.
	Call(ctx context.Context, req Request) (json.RawMessage, error)
	// Executor runs pgonce's statements in the transaction.
	Executor() store.Executor
	// Commit and Rollback end the transaction.
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// TxEnd says what an outcome of a transactional tool's attempt left for
// [Runner.Record] to do.
type TxEnd int

const (
	// TxNone means the outcome is recorded as any other (a failure, after the
	// transaction rolled back, or any outcome of another tool).
	TxNone TxEnd = iota
	// TxCommitted means the outcome committed with the effect; nothing is
	// left to record.
	TxCommitted
	// TxLeft means nothing is recorded, and the key is left as the store holds
	// it: the attempt lost its key (its lease was taken over) and rolled
	// back, or the result of its COMMIT could not be read back, and the
	// reconciler puts the key back to pending once its lease has expired
	// if the COMMIT did not take.
	TxLeft
)

// runTx runs an attempt of a transactional tool: it opens a transaction,
// runs the provider in it under [Config.CallTimeout], and records a
// success in the same transaction, fenced by the attempt, before it
// commits. The effect and the outcome commit together, or neither does:
// a provider error, a panic, a deadline or a lost lease rolls the
// transaction back, and the failure is recorded by [Runner.Record] in a
// statement of its own, never as uncertain. A COMMIT whose result is lost
// is settled by reading the key back ([store.Store.KeyReadBack]).
func (r *Runner) runTx(ctx context.Context, a Attempt, backoff func(attempt int) time.Duration) Outcome {
	tool := a.Tool
	out := r.NewOutcome(a)
	fail := func(err error) Outcome { return out.retry(a, backoff, false, err, r.config.FailureBody) }

	beginCtx, cancel := context.WithTimeout(ctx, r.config.StatementTimeout)
	tx, err := tool.Begin(beginCtx)
	cancel()
	if err != nil {
		return fail(fmt.Errorf("begin transaction: %w", err))
	}
	// Every statement of pgonce's own in the transaction runs on after the
	// caller's context is gone, as recording does.
	stmtCtx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), r.sendTimeout(out))
	}
	rollback := func() error {
		ctx, cancel := stmtCtx()
		defer cancel()
		return tx.Rollback(ctx)
	}

	callCtx, cancel := context.WithTimeout(ctx, r.config.CallTimeout)
	resp, err := r.call(callCtx, tool, &Op{Request: a.Request, Delivery: tool.Delivery, MaxAttempts: a.MaxAttempts}, tx.Call)
	late := errors.Is(callCtx.Err(), context.DeadlineExceeded)
	cancel()
	switch {
	case late && err == nil:
		err = fmt.Errorf("%w: the call took longer than %s", ErrTxTimeout, r.config.CallTimeout)
	case late:
		err = fmt.Errorf("%w: the call took longer than %s: %w", ErrTxTimeout, r.config.CallTimeout, err)
	}
	if err != nil {
		if rbErr := rollback(); errors.Is(rbErr, store.ErrTxDone) {
			out.Err = fmt.Errorf("%w: %w", ErrTxClosed, err)
			return out.needsReview()
		}
		out.SlowDown = slowDownDelay(err)
		if !late && r.config.Classify(err) == Permanent {
			out.Kind, out.Failure, out.Err, out.SlowDown = Failed, r.config.FailureBody(err), err, 0
			return out
		}
		return fail(txTimeout(err))
	}
	out = out.succeeded(resp)

	recordCtx, cancel := stmtCtx()
	defer cancel()
	params := &store.FinishInTxParams{
		Key:                a.Request.Key,
		Scope:              a.Scope,
		Attempt:            a.Request.Attempt,
		State:              store.StateSucceeded,
		Response:           out.Response,
		Retention:          out.Retention,
		TombstoneRetention: r.config.TombstoneRetention,
		Now:                r.NowParam(),
	}
	if !r.config.NotifyDisabled {
		params.Channel = r.store.DoneChannel
	}
	written, err := tx.Executor().KeyFinishInTx(recordCtx, params)
	if err != nil || !written {
		rbErr := rollback()
		switch {
		case errors.Is(err, store.ErrTxDone) || errors.Is(rbErr, store.ErrTxDone):
			out = r.NewOutcome(a)
			out.Err = fmt.Errorf("%w: record outcome: %w", ErrTxClosed, errors.Join(err, rbErr))
			return out.needsReview()
		case err != nil:
			out = r.NewOutcome(a)
			return fail(txTimeout(fmt.Errorf("record outcome in transaction: %w", err)))
		}
		// Fenced out: the key was taken over, and the effect rolled back.
		out.TxEnd = TxLeft
		return out
	}
	err = tx.Commit(recordCtx)
	if err == nil {
		out.TxEnd = TxCommitted
		return out
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) || !store.MayHaveRun(err) {
		// The server answered (a deferred constraint, a serialization
		// failure), or never got the COMMIT: the transaction rolled back.
		out = r.NewOutcome(a)
		return fail(txTimeout(fmt.Errorf("commit: %w", err)))
	}
	return r.settleCommit(ctx, a, out, err, fail)
}

// settleCommit decides, by reading the key back, whether a COMMIT whose
// reply was lost (commitErr) took: committed with the outcome out, or
// rolled back, and then a failure to record. Only the attempt's own
// transaction could have finished the key at its attempt, and the read
// waits for a transaction still holding the key's row.
func (r *Runner) settleCommit(ctx context.Context, a Attempt, out Outcome, commitErr error, fail func(error) Outcome) Outcome {
	ctx = context.WithoutCancel(ctx)
	until := time.Now().Add(RecordTimeout)
	var back *store.ReadBack
	_, err := r.retryTransient(ctx, until, r.config.StatementTimeout, func(ctx context.Context) error {
		var err error
		back, err = r.store.KeyReadBack(ctx, a.Request.Key)
		return err
	})
	switch {
	case err != nil:
		r.logger(ctx).WarnContext(ctx, "pgonce: the result of a transactional tool's COMMIT is unknown, and reading its key back failed; the reconciler settles it",
			"key", a.Request.Key, "tool", a.Request.Tool, "attempt", a.Request.Attempt, "commit_error", commitErr, "error", err)
		out.TxEnd = TxLeft
		return out
	case back.Attempt == a.Request.Attempt && back.State == store.StateSucceeded:
		out.TxEnd = TxCommitted
		return out
	case back.Attempt == a.Request.Attempt && back.State == store.StateOpen && back.Leased:
		return fail(fmt.Errorf("commit lost, and the key read back shows it rolled back: %w", commitErr))
	}
	out.TxEnd = TxLeft
	return out
}

// txTimeout marks err with [ErrTxTimeout] when it is a statement or lock
// timeout in the transaction.
func txTimeout(err error) error {
	if errors.Is(store.InterpretError(err), store.ErrTimeout) && !errors.Is(err, ErrTxTimeout) {
		return fmt.Errorf("%w: %w", ErrTxTimeout, err)
	}
	return err
}
