package attempt

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgonce/pgonce/internal/store"
)

// RecordTimeout bounds how long recording outcomes may take, tries again
// included, and how long it continues once the caller's context is gone: an
// outcome whose provider acted is worth persisting through an outage, and
// after a cancel. It is not bounded by the attempt's lease: each outcome is
// fenced by its attempt, so a write that comes after a takeover changes
// nothing, and one that comes after the lease but before a takeover is the
// outcome the reconciler would otherwise have had to guess. Outcomes of
// [LargeOutcomeBytes] or more add to it what their statements' deadlines
// add to [Config.StatementTimeout] (see [Runner.sendTimeout]).
const RecordTimeout = 30 * time.Second

// Backoff between the tries of a statement that records outcomes.
const (
	recordRetryMin = 20 * time.Millisecond
	recordRetryMax = time.Second
)

// Record persists outcomes, each fenced by its attempt, and returns the keys
// whose outcome it wrote. An outcome whose attempt no longer holds its key
// (the lease was taken over) writes nothing. Outcomes finished together are
// written in one statement, retries in another.
//
// A statement that fails transiently ([store.IsTransient]: a killed
// connection, a restarting server) is tried again on another connection,
// with a backoff from 20ms to 1s, for up to [RecordTimeout], past the
// attempts' leases if need be: the fence makes this safe, since a key taken
// over since (its attempt moved on) is left as it is. When a try may have
// run although its reply was lost, the keys the next try finds no longer
// held are read back, and those left at their attempt without a lease count
// as written: only that attempt could have ended its lease. An outcome found
// fenced out (its key was taken over) is logged as a warning, with its key,
// tool, attempt and kind: what its provider answered is known only to the
// log.
//
// Error text is stored sanitised (see [SanitizeText]). A statement over
// several outcomes that fails for good (one row's data the database rejects
// fails its whole batch) is split, and its outcomes written one by one, so
// that only the bad row is affected. An outcome whose own data the database
// rejects ([store.IsDataError]) sends its key to review, with the reason as
// its last error, so that it is never attempted again, and is logged in
// full; after any other failure its key stays in flight for the reconciler.
//
// Every final outcome an operator may have to act on (a failure, a key sent
// to review) is logged as a warning once it is recorded; see
// [Runner.logFinal]. Logs go to the logger of ctx ([WithLogger]), or else
// [Config.Logger].
//
// An outcome of a transactional tool's attempt that its transaction
// already committed ([TxCommitted]) counts as written, and one that left
// its key as it was ([TxLeft]) writes nothing.
//
// Recording continues after ctx is cancelled, for up to [RecordTimeout].
func (r *Runner) Record(ctx context.Context, outcomes []Outcome) (map[string]bool, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx),
		RecordTimeout+r.sendTimeout(outcomes...)-r.config.StatementTimeout)
	defer cancel()
	until, _ := ctx.Deadline()
	var finishes, releases, large []Outcome
	written := make(map[string]bool, len(outcomes))
	for _, o := range outcomes {
		switch {
		case o.TxEnd == TxCommitted:
			// Recorded in the transaction that held its effect.
			written[o.Key] = true
			r.logFinal(ctx, o)
		case o.TxEnd == TxLeft:
			r.logger(ctx).WarnContext(ctx, "pgonce: a transactional attempt wrote nothing; its key is left as the store holds it",
				"key", o.Key, "tool", o.Tool, "attempt", o.Attempt, "outcome", o.Kind.String())
		case o.Kind == Retry:
			releases = append(releases, o)
		case o.Large():
			large = append(large, o)
		default:
			finishes = append(finishes, o)
		}
	}
	finishErr := r.recordAll(ctx, until, finishes, r.finish, written)
	releaseErr := r.recordAll(ctx, until, releases, r.release, written)
	if finishErr == nil {
		r.settleFencedOut(ctx, until, finishes, written)
	}
	if releaseErr == nil {
		r.logFencedOut(ctx, releases, written)
	}
	errs := []error{finishErr, releaseErr}
	for _, o := range large {
		errs = append(errs, r.recordLarge(ctx, until, o, written))
	}
	return written, errors.Join(errs...)
}

// LargeOutcomeBytes is the size of response and failure from which an
// outcome is large: [Runner.Record] writes it alone, after the others, under
// a lease it keeps extending, so that its bytes, however long they take to
// reach the database, neither hold up the outcomes recorded with it nor
// outlast its lease.
const LargeOutcomeBytes = 256 << 10

// sendTimeout is the deadline of a statement that sends outs:
// [Config.StatementTimeout], and as much again for every [LargeOutcomeBytes]
// of their responses and failures, so that it grows with what the statement
// carries. A deadline that does not would cut off every try at sending a
// multi-megabyte outcome over a link, or to a server, slow enough to take
// longer than StatementTimeout, and leave its key to the reconciler.
func (r *Runner) sendTimeout(outs ...Outcome) time.Duration {
	size := 0
	for _, o := range outs {
		size += len(o.Response) + len(o.Failure)
	}
	return r.config.StatementTimeout * time.Duration(1+size/LargeOutcomeBytes)
}

// Large reports whether o is a large outcome (see [LargeOutcomeBytes]).
func (o Outcome) Large() bool {
	return o.Kind != Retry && len(o.Response)+len(o.Failure) >= LargeOutcomeBytes
}

// recordLarge writes the large outcome o alone. It first extends o's lease,
// fenced by its attempt, and keeps extending it every third of a lease
// until the write ends: a multi-megabyte outcome on a slow link can take
// longer than the lease to send, and the reconciler would take its key over
// meanwhile. A key its attempt no longer holds is not written.
func (r *Runner) recordLarge(ctx context.Context, until time.Time, o Outcome, written map[string]bool) error {
	lease := r.config.Lease
	extend := func() (held bool, err error) {
		extendCtx, cancel := context.WithTimeout(ctx, r.config.StatementTimeout)
		defer cancel()
		return r.store.ExtendLease(extendCtx, o.Key, o.Attempt, lease, r.NowParam())
	}
	var held bool
	_, err := r.retryTransient(ctx, until, r.config.StatementTimeout, func(context.Context) error {
		var err error
		held, err = extend()
		return err
	})
	switch {
	case err == nil && !held:
		r.settleFencedOut(ctx, until, []Outcome{o}, written)
		return nil
	case err != nil:
		// The write tries on its own; the lease may yet hold.
		r.logger(ctx).WarnContext(ctx, "pgonce: extending the lease of a large outcome failed; recording it anyway",
			"key", o.Key, "attempt", o.Attempt, "error", err)
	}

	keepCtx, stop := context.WithCancel(ctx)
	kept := make(chan struct{})
	go func() {
		defer close(kept)
		ticker := time.NewTicker(max(lease/3, 10*time.Millisecond))
		defer ticker.Stop()
		for {
			select {
			case <-keepCtx.Done():
				return
			case <-ticker.C:
			}
			if held, err := extend(); err == nil && !held {
				return // recorded, or taken over: nothing left to keep
			} else if err != nil && keepCtx.Err() == nil {
				r.logger(ctx).DebugContext(ctx, "pgonce: extending the lease of a large outcome failed; trying again",
					"key", o.Key, "attempt", o.Attempt, "error", err)
			}
		}
	}()
	err = r.recordAll(ctx, until, []Outcome{o}, r.finish, written)
	stop()
	<-kept
	if err == nil {
		r.settleFencedOut(ctx, until, []Outcome{o}, written)
	}
	return err
}

// LeaseExpiredReason is the error the reconciler records with a key it
// took over after its attempt's lease ran out and sent to review, the
// outcome of that attempt unknown.
const LeaseExpiredReason = "lease expired: the attempt's outcome is unknown"

// settleFencedOut records, where it safely can, the final outcomes of outs
// that were fenced out, all recorded without error: an outcome the
// provider answered to an attempt that the reconciler took over after its
// lease (the worker starved of CPU, its record held up by the network)
// settles the key if the reconciler sent it to review for want of that
// outcome ([LeaseExpiredReason]) and nobody acted since, or holds it still,
// undecided. The reconciler never calls a provider, so the attempt's
// answer is the key's outcome; see [store.Store.SettleReview]. Each
// settlement is logged as a warning (a lease too short for the load it
// runs under), and the rest are logged as fenced out.
func (r *Runner) settleFencedOut(ctx context.Context, until time.Time, outs []Outcome, written map[string]bool) {
	var fenced []Outcome
	for _, o := range outs {
		if written[o.Key] {
			continue
		}
		if o.Kind == Succeeded || (o.Kind == Failed && !o.Ambiguous) {
			settled, err := r.settleReview(ctx, until, o)
			if err != nil {
				r.logger(ctx).WarnContext(ctx, "pgonce: settling the review of a key taken over failed",
					"key", o.Key, "attempt", o.Attempt, "error", err)
			}
			if settled {
				written[o.Key] = true
				r.logger(ctx).WarnContext(ctx, "pgonce: an outcome came after its key was taken over; it settles the key",
					"key", o.Key, "tool", o.Tool, "attempt", o.Attempt, "outcome", o.Kind.String())
				continue
			}
		}
		fenced = append(fenced, o)
	}
	r.logFencedOut(ctx, fenced, written)
}

// settleReview records o with [store.Store.SettleReview], trying again
// while failures are transient and until allows.
func (r *Runner) settleReview(ctx context.Context, until time.Time, o Outcome) (bool, error) {
	params := &store.SettleReviewParams{
		Outcome: store.Outcome{
			Key:       o.Key,
			Attempt:   o.Attempt,
			State:     o.Kind.storedState(),
			Response:  o.Response,
			Failure:   o.Failure,
			Retention: o.Retention,
			LastError: errorText(o.Err),
		},
		ReviewReason:       LeaseExpiredReason,
		TombstoneRetention: r.config.TombstoneRetention,
		ResolvedBy:         "pgonce",
		Reason:             fmt.Sprintf("the outcome of attempt %d came after the reconciler took the key over", o.Attempt),
		Now:                r.NowParam(),
	}
	if !r.config.NotifyDisabled {
		params.Channel = r.store.DoneChannel
	}
	var settled bool
	_, err := r.retryTransient(ctx, until, r.sendTimeout(o), func(ctx context.Context) error {
		var err error
		settled, err = r.store.SettleReview(ctx, params)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("settle review: %w", err)
	}
	if settled {
		r.logFinal(ctx, o)
	}
	return settled, nil
}

// logFencedOut warns of each outcome of outs, all recorded without error,
// that wrote nothing: its key no longer held its attempt (the reconciler
// took it over after the lease, or an operator acted), so what its provider
// answered is in this log alone.
func (r *Runner) logFencedOut(ctx context.Context, outs []Outcome, written map[string]bool) {
	for _, o := range outs {
		if written[o.Key] {
			continue
		}
		r.logger(ctx).WarnContext(ctx, "pgonce: an outcome came after its key was taken over; it was not recorded",
			"key", o.Key, "tool", o.Tool, "attempt", o.Attempt, "outcome", o.Kind.String(),
			"response", clipLog(o.Response), "failure", clipLog(o.Failure), "outcome_error", errorText(o.Err))
	}
}

// clipLog is b as log text, cut to logClip bytes.
func clipLog(b []byte) string {
	const logClip = 4 << 10
	if len(b) > logClip {
		return string(b[:logClip]) + "…"
	}
	return string(b)
}

// recordStatement writes outs in one statement and marks the keys written.
type recordStatement func(ctx context.Context, outs []Outcome, written map[string]bool) error

// recordAll writes outs with stmt, trying again while failures are transient
// and until allows.
func (r *Runner) recordAll(ctx context.Context, until time.Time, outs []Outcome, stmt recordStatement, written map[string]bool) error {
	if len(outs) == 0 {
		return nil
	}
	mayHaveRun, err := r.retryTransient(ctx, until, r.sendTimeout(outs...), func(ctx context.Context) error { return stmt(ctx, outs, written) })
	switch {
	case err == nil && mayHaveRun:
		return r.readBackRecorded(ctx, until, outs, written)
	case err == nil || store.IsTransient(err) || ctx.Err() != nil:
		return err
	case len(outs) > 1:
		// One row's bad data fails its whole statement: write row by row, so
		// that only the bad row is affected.
		r.logger(ctx).WarnContext(ctx, "pgonce: recording a batch of outcomes failed; recording them one by one",
			"error", err, "outcomes", len(outs))
		errs := make([]error, 0, len(outs))
		for _, o := range outs {
			errs = append(errs, r.recordAll(ctx, until, []Outcome{o}, stmt, written))
		}
		return errors.Join(errs...)
	case !store.IsDataError(err):
		// Not this row's data: the row stays in flight for the reconciler.
		return err
	}
	return r.recordUnrecordable(ctx, until, outs[0], err, written)
}

// recordUnrecordable sends the key of an outcome that cannot be stored as it
// is (err says why) to review, so that it is never attempted again: what its
// provider did is known only to the log.
func (r *Runner) recordUnrecordable(ctx context.Context, until time.Time, o Outcome, err error, written map[string]bool) error {
	r.logger(ctx).ErrorContext(ctx, "pgonce: an outcome cannot be recorded; its key goes to review",
		"key", o.Key, "attempt", o.Attempt, "outcome", o.Kind.String(), "response", string(o.Response),
		"failure", string(o.Failure), "outcome_error", errorText(o.Err), "error", err)
	review := Outcome{
		Key:     o.Key,
		Scope:   o.Scope,
		Tool:    o.Tool,
		Attempt: o.Attempt,
		Kind:    NeedsReview,
		Err:     fmt.Errorf("%s outcome could not be recorded: %w", o.Kind, err),
	}
	_, reviewErr := r.retryTransient(ctx, until, r.config.StatementTimeout, func(ctx context.Context) error {
		return r.finish(ctx, []Outcome{review}, written)
	})
	if reviewErr != nil {
		return fmt.Errorf("record outcome of %s: %w", o.Key, errors.Join(err, reviewErr))
	}
	return nil
}

// readBackRecorded marks as written the outcomes of outs that an earlier
// try wrote although its reply was lost.
func (r *Runner) readBackRecorded(ctx context.Context, until time.Time, outs []Outcome, written map[string]bool) error {
	var attempts []store.AttemptRef
	for _, o := range outs {
		if !written[o.Key] {
			attempts = append(attempts, store.AttemptRef{Key: o.Key, Scope: o.Scope, Attempt: o.Attempt})
		}
	}
	if len(attempts) == 0 {
		return nil
	}
	_, err := r.retryTransient(ctx, until, r.config.StatementTimeout, func(ctx context.Context) error {
		keys, err := r.store.RecordedAttempts(ctx, attempts)
		for _, key := range keys {
			written[key] = true
		}
		r.logRecorded(ctx, outs, keys)
		return err
	})
	if err != nil {
		return fmt.Errorf("read back recorded outcomes: %w", err)
	}
	return nil
}

// retryTransient runs try, each time under timeout ([Config.StatementTimeout],
// or [Runner.sendTimeout] for a statement that sends outcomes), until it
// succeeds, fails for good, or until leaves no time for another try after
// the backoff. It reports whether a failed try may have run on the server.
func (r *Runner) retryTransient(ctx context.Context, until time.Time, timeout time.Duration, try func(ctx context.Context) error) (mayHaveRun bool, err error) {
	wait := recordRetryMin
	for {
		tryCtx, cancel := context.WithTimeout(ctx, timeout)
		err = try(tryCtx)
		cancel()
		if err == nil || !store.IsTransient(err) || ctx.Err() != nil {
			return mayHaveRun, err
		}
		mayHaveRun = mayHaveRun || store.MayHaveRun(err)
		if time.Now().Add(wait).After(until) {
			return mayHaveRun, err
		}
		r.logger(ctx).WarnContext(ctx, "pgonce: recording outcomes failed; trying again",
			"error", err, "retry_in", wait)
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return mayHaveRun, err
		case <-timer.C:
		}
		wait = min(2*wait, recordRetryMax)
	}
}

// logRecorded logs, with [Runner.logFinal], the outcomes of outs whose keys
// were just recorded.
func (r *Runner) logRecorded(ctx context.Context, outs []Outcome, keys []string) {
	if len(keys) == 0 {
		return
	}
	recorded := make(map[string]bool, len(keys))
	for _, key := range keys {
		recorded[key] = true
	}
	for _, o := range outs {
		if recorded[o.Key] {
			r.logFinal(ctx, o)
		}
	}
}

// NowParam is the time passed to statements: nil lets the database's clock
// decide, which keeps every lease on one clock; the client's NowFunc when it
// has one.
func (r *Runner) NowParam() *time.Time {
	if r.config.NowFunc == nil {
		return nil
	}
	now := r.config.NowFunc()
	return &now
}

// finish writes final outcomes with [store.Store.Finish].
func (r *Runner) finish(ctx context.Context, outs []Outcome, written map[string]bool) error {
	params := &store.FinishParams{Now: r.NowParam(), TombstoneRetention: r.config.TombstoneRetention}
	if !r.config.NotifyDisabled {
		params.Channel = r.store.DoneChannel
	}
	for _, o := range outs {
		params.Outcomes = append(params.Outcomes, store.Outcome{
			Key:       o.Key,
			Scope:     o.Scope,
			Attempt:   o.Attempt,
			State:     o.Kind.storedState(),
			Response:  o.Response,
			Failure:   o.Failure,
			Retention: o.Retention,
			LastError: errorText(o.Err),
		})
	}
	keys, err := r.store.Finish(ctx, params)
	if err != nil {
		return fmt.Errorf("record outcomes: %w", err)
	}
	for _, key := range keys {
		written[key] = true
	}
	r.logRecorded(ctx, outs, keys)
	return nil
}

// release puts retryable attempts back to pending with
// [store.Store.Release].
func (r *Runner) release(ctx context.Context, outs []Outcome, written map[string]bool) error {
	params := &store.ReleaseParams{Now: r.NowParam()}
	if !r.config.NotifyDisabled {
		params.Channel = r.store.WorkChannel
	}
	for _, o := range outs {
		params.Releases = append(params.Releases, store.Release{
			Key:       o.Key,
			Scope:     o.Scope,
			Attempt:   o.Attempt,
			Delay:     o.RetryDelay,
			Ambiguous: o.Ambiguous,
			LastError: errorText(o.Err),
		})
	}
	keys, err := r.store.Release(ctx, params)
	if err != nil {
		return fmt.Errorf("release attempts: %w", err)
	}
	for _, key := range keys {
		written[key] = true
	}
	return nil
}
