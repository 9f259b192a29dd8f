package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pgonce/pgonce/internal/store"
)

// Attempt is one claimed attempt of a key, as the inline path and the
// dispatcher run it.
//
// API is not stable. DO NOT USE.
type Attempt struct {
	// Tool is the key's registered tool.
	Tool *Tool
	// Request is what the provider receives.
	Request Request
	// Ambiguous reports that an earlier attempt may have acted.
	Ambiguous bool
	// FirstAttemptedAt starts the provider's key-retention window, by the
	// database's clock.
	FirstAttemptedAt time.Time
	// ClaimedNow is the database's clock when the attempt was claimed, as the
	// claiming statement read it, and ClaimedAt the local clock (with its
	// monotonic reading) taken just before that statement was sent. Time
	// since FirstAttemptedAt is ClaimedNow - FirstAttemptedAt plus the local
	// time elapsed since ClaimedAt: it never compares the local clock with
	// the database's, which may disagree by any amount. A zero ClaimedNow
	// means the time since the first attempt is unknown.
	ClaimedNow time.Time
	ClaimedAt  time.Time
	// MaxAttempts turns a retryable failure into a final one at this attempt.
	// Zero means no limit.
	MaxAttempts int
	// Lease is how long the claim holds the key, from the claim; with
	// ClaimedAt it gives the local time by which the lease has surely not yet
	// ended. Zero means unknown.
	Lease time.Duration
}

// leaseDeadline is the local time before which the attempt's lease surely
// holds: the lease was set, by the database, after ClaimedAt.
func (a Attempt) leaseDeadline() time.Time {
	if a.Lease <= 0 || a.ClaimedAt.IsZero() {
		return time.Time{}
	}
	return a.ClaimedAt.Add(a.Lease)
}

// OutcomeKind classifies how an attempt ended.
//
// API is not stable. DO NOT USE.
type OutcomeKind int

// Outcome kinds.
const (
	OutcomeSucceeded OutcomeKind = iota
	OutcomeFailed
	OutcomeNeedsReview
	OutcomeRetry
)

// String names the outcome kind, for logs.
func (k OutcomeKind) String() string {
	switch k {
	case OutcomeSucceeded:
		return "succeeded"
	case OutcomeFailed:
		return "failed"
	case OutcomeNeedsReview:
		return "needs_review"
	case OutcomeRetry:
		return "retry"
	}
	return fmt.Sprintf("OutcomeKind(%d)", int(k))
}

// dbState is the stored key state a final outcome leaves.
func (k OutcomeKind) dbState() string {
	switch k {
	case OutcomeSucceeded:
		return dbStateSucceeded
	case OutcomeFailed:
		return dbStateFailed
	case OutcomeNeedsReview:
		return dbStateNeedsReview
	}
	panic(fmt.Sprintf("outcome kind %d has no final state", int(k)))
}

// Outcome is how an attempt ended, ready to be recorded.
//
// API is not stable. DO NOT USE.
type Outcome struct {
	Key       Key
	Attempt   int
	Kind      OutcomeKind
	Response  json.RawMessage
	Failure   json.RawMessage
	Retention time.Duration
	// RetryDelay, Ambiguous and Err describe an OutcomeRetry.
	RetryDelay time.Duration
	Ambiguous  bool
	Err        error
	// LeaseDeadline, when set, is the local time by which the attempt's
	// lease surely still holds: [Client.Record] tries no statement again
	// past it.
	LeaseDeadline time.Time
}

// RunAttempt runs one claimed attempt: a lookup first where an earlier
// attempt left the effect unknown and the tool can look up, then the provider
// call under [Config.CallTimeout] unless callTimeout overrides it. It never
// panics: a provider that panics may have acted before it did, so a panic is
// an uncertain outcome ([IsAmbiguous]) and follows the tool's [Delivery]
// like any other. backoff gives the delay before retry n (from 1).
//
// API is not stable. DO NOT USE.
func (c *Client[TTx]) RunAttempt(ctx context.Context, a Attempt, p Provider, callTimeout time.Duration, backoff func(attempt int) time.Duration) Outcome {
	if callTimeout <= 0 {
		callTimeout = c.config.CallTimeout
	}
	tool := a.Tool
	out := Outcome{
		Key:           a.Request.Key,
		Attempt:       a.Request.Attempt,
		Retention:     cmp.Or(tool.Opts.Retention, c.config.Retention),
		LeaseDeadline: a.leaseDeadline(),
	}
	if p == nil {
		p = tool.Provider
	}

	if a.Ambiguous {
		switch how, resp, err := c.Settle(ctx, a, p, callTimeout); how {
		case SettleReview:
			return out.needsReview()
		case SettleFound:
			return out.succeeded(resp)
		case SettleLookupFailed:
			return out.retry(a, backoff, true, err)
		case SettleNotFound:
			a.Ambiguous = false
		case SettleByKey:
		}
	}

	resp, err := c.call(ctx, p, a.Request, callTimeout)
	switch {
	case err == nil:
		return out.succeeded(resp)
	case isPermanent(err):
		out.Kind, out.Failure, out.Err = OutcomeFailed, failureBody(err), err
		return out
	case IsAmbiguous(err):
		if tool.Delivery == AtMostOnce {
			out.Err = err
			return out.needsReview()
		}
		return out.retry(a, backoff, true, err)
	default:
		return out.retry(a, backoff, a.Ambiguous, err)
	}
}

// Settlement is how an attempt after one whose outcome is unknown can
// proceed, by the tool's [Delivery].
//
// API is not stable. DO NOT USE.
type Settlement int

// Settlements.
const (
	// SettleByKey: the provider deduplicates on the key within its key
	// retention, so calling again with the same key is safe.
	SettleByKey Settlement = iota
	// SettleNotFound: a lookup found no effect; calling again is safe.
	SettleNotFound
	// SettleFound: a lookup found the effect, whose response comes along.
	SettleFound
	// SettleReview: nobody can tell; the key needs review.
	SettleReview
	// SettleLookupFailed: the lookup failed; the outcome is still unknown.
	SettleLookupFailed
)

// Settle decides, without calling the provider, how attempt a may proceed
// after an attempt whose outcome is unknown: [AtMostOnce] tools go to review;
// [LookupByNaturalID] tools, and [IdempotentByKey] ones past their provider's
// key retention that can look up, read before they write; the latter without
// a lookup go to review; the rest retry by key. p, when not nil, replaces the
// tool's provider; a lookup runs under callTimeout (0: [Config.CallTimeout])
// and a panic in it becomes an error. It is shared by [Client.RunAttempt]
// and the reconciler.
//
// API is not stable. DO NOT USE.
func (c *Client[TTx]) Settle(ctx context.Context, a Attempt, p Provider, callTimeout time.Duration) (Settlement, json.RawMessage, error) {
	tool := a.Tool
	if p == nil {
		p = tool.Provider
	}
	if callTimeout <= 0 {
		callTimeout = c.config.CallTimeout
	}
	lookuper, canLookup := p.(Lookuper)
	pastKeyWindow := tool.Delivery == IdempotentByKey && tool.Opts.KeyRetention > 0 &&
		!a.FirstAttemptedAt.IsZero() && a.sinceFirstAttempt() > tool.Opts.KeyRetention
	switch {
	case tool.Delivery == AtMostOnce:
		return SettleReview, nil, nil
	case tool.Delivery == LookupByNaturalID || (pastKeyWindow && canLookup):
		// Read before write: the earlier attempt may have acted.
		resp, found, err := c.lookup(ctx, lookuper, a.Request, callTimeout)
		switch {
		case err != nil:
			return SettleLookupFailed, nil, fmt.Errorf("lookup: %w", err)
		case found:
			if resp == nil {
				resp = json.RawMessage{}
			}
			return SettleFound, resp, nil
		}
		return SettleNotFound, nil, nil
	case pastKeyWindow:
		// The provider has forgotten the key: a retry could act twice.
		return SettleReview, nil, nil
	}
	return SettleByKey, nil, nil
}

// sinceFirstAttempt is how long ago the key was first attempted, by the
// database's clock (see [Attempt.ClaimedNow]). Unknown counts as forever: a
// retry by key is only safe when the provider surely still remembers it.
func (a Attempt) sinceFirstAttempt() time.Duration {
	if a.ClaimedNow.IsZero() {
		return math.MaxInt64
	}
	elapsed := a.ClaimedNow.Sub(a.FirstAttemptedAt)
	if !a.ClaimedAt.IsZero() {
		elapsed += time.Since(a.ClaimedAt)
	}
	return elapsed
}

func (o Outcome) succeeded(resp json.RawMessage) Outcome {
	if resp == nil {
		// nil would be stored as NULL; an empty response is still a response.
		resp = json.RawMessage{}
	}
	o.Kind, o.Response = OutcomeSucceeded, resp
	return o
}

func (o Outcome) needsReview() Outcome {
	o.Kind = OutcomeNeedsReview
	return o
}

func (o Outcome) retry(a Attempt, backoff func(int) time.Duration, ambiguous bool, err error) Outcome {
	o.Err, o.Ambiguous = err, ambiguous
	if a.MaxAttempts > 0 && a.Request.Attempt >= a.MaxAttempts {
		if ambiguous && a.Tool.Delivery != IdempotentByKey {
			return o.needsReview()
		}
		o.Kind, o.Failure = OutcomeFailed, failureBody(fmt.Errorf("gave up after %d attempts: %w", a.Request.Attempt, err))
		return o
	}
	o.Kind = OutcomeRetry
	if backoff != nil {
		o.RetryDelay = backoff(a.Request.Attempt)
	}
	return o
}

func isPermanent(err error) bool {
	var permanent *PermanentError
	return errors.As(err, &permanent)
}

// call runs the provider under the call timeout and turns a panic into an
// ambiguous error, logged with its stack: the provider may have acted before
// it panicked, so a panic is never taken for "nothing happened".
func (c *Client[TTx]) call(ctx context.Context, p Provider, req Request, timeout time.Duration) (resp json.RawMessage, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	defer func() {
		if r := recover(); r != nil {
			c.config.Logger.ErrorContext(ctx, "pgonce: provider panicked",
				"tool", req.Tool, "key", req.Key, "attempt", req.Attempt, "panic", r, "stack", string(debug.Stack()))
			err = Ambiguous(fmt.Errorf("provider panicked: %v", r))
		}
	}()
	return p.Call(ctx, req)
}

func (c *Client[TTx]) lookup(ctx context.Context, l Lookuper, req Request, timeout time.Duration) (resp json.RawMessage, found bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	defer func() {
		if r := recover(); r != nil {
			c.config.Logger.ErrorContext(ctx, "pgonce: lookup panicked",
				"tool", req.Tool, "key", req.Key, "panic", r, "stack", string(debug.Stack()))
			err = fmt.Errorf("lookup panicked: %v", r)
		}
	}()
	return l.Lookup(ctx, req)
}

// RecordTimeout bounds how long recording outcomes may take once the
// caller's context is gone: an outcome whose provider acted is worth
// persisting after a cancel.
const RecordTimeout = 10 * time.Second

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
// with a backoff from 20ms to 1s, for up to [RecordTimeout] and never past
// the earliest lease among outcomes (see [Outcome.LeaseDeadline]). The fence
// makes this safe. When a try may have run although its reply was lost, the
// keys the next try finds no longer held are read back, and those left at
// their attempt without a lease count as written: only that attempt could
// have ended its lease.
//
// Error text is stored sanitised: valid UTF-8 without NUL, at most 2 KiB. A
// statement over several outcomes that fails for good (one row's data the
// database rejects fails its whole batch) is split, and its outcomes written
// one by one, so that only the bad row is affected. An outcome whose own
// data the database rejects ([store.IsDataError]) sends its key to review,
// with the reason as its last error, so that it is never attempted again,
// and is logged in full; after any other failure its key stays in flight
// for the reconciler.
//
// Recording continues after ctx is cancelled, for up to [RecordTimeout].
//
// API is not stable. DO NOT USE.
func (c *Client[TTx]) Record(ctx context.Context, outcomes []Outcome) (map[Key]bool, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), RecordTimeout)
	defer cancel()
	until, _ := ctx.Deadline()
	var finishes, releases []Outcome
	for _, o := range outcomes {
		if !o.LeaseDeadline.IsZero() && o.LeaseDeadline.Before(until) {
			until = o.LeaseDeadline
		}
		if o.Kind == OutcomeRetry {
			releases = append(releases, o)
		} else {
			finishes = append(finishes, o)
		}
	}
	written := make(map[Key]bool, len(outcomes))
	finishErr := c.recordAll(ctx, until, finishes, c.finish, written)
	releaseErr := c.recordAll(ctx, until, releases, c.release, written)
	return written, errors.Join(finishErr, releaseErr)
}

// recordStatement writes outs in one statement and marks the keys written.
type recordStatement func(ctx context.Context, outs []Outcome, written map[Key]bool) error

// recordAll writes outs with stmt, trying again while failures are transient
// and until allows.
func (c *Client[TTx]) recordAll(ctx context.Context, until time.Time, outs []Outcome, stmt recordStatement, written map[Key]bool) error {
	if len(outs) == 0 {
		return nil
	}
	mayHaveRun, err := c.retryTransient(ctx, until, func(ctx context.Context) error { return stmt(ctx, outs, written) })
	switch {
	case err == nil && mayHaveRun:
		return c.readBackRecorded(ctx, until, outs, written)
	case err == nil || store.IsTransient(err) || ctx.Err() != nil:
		return err
	case len(outs) > 1:
		// One row's bad data fails its whole statement: write row by row, so
		// that only the bad row is affected.
		c.config.Logger.WarnContext(ctx, "pgonce: recording a batch of outcomes failed; recording them one by one",
			"error", err, "outcomes", len(outs))
		errs := make([]error, 0, len(outs))
		for _, o := range outs {
			errs = append(errs, c.recordAll(ctx, until, []Outcome{o}, stmt, written))
		}
		return errors.Join(errs...)
	case !store.IsDataError(err):
		// Not this row's data: the row stays in flight for the reconciler.
		return err
	}
	return c.recordUnrecordable(ctx, until, outs[0], err, written)
}

// recordUnrecordable sends the key of an outcome that cannot be stored as it
// is (err says why) to review, so that it is never attempted again: what its
// provider did is known only to the log.
func (c *Client[TTx]) recordUnrecordable(ctx context.Context, until time.Time, o Outcome, err error, written map[Key]bool) error {
	c.config.Logger.ErrorContext(ctx, "pgonce: an outcome cannot be recorded; its key goes to review",
		"key", o.Key, "attempt", o.Attempt, "outcome", o.Kind.String(), "response", string(o.Response),
		"failure", string(o.Failure), "outcome_error", errorText(o.Err), "error", err)
	review := Outcome{
		Key:     o.Key,
		Attempt: o.Attempt,
		Kind:    OutcomeNeedsReview,
		Err:     fmt.Errorf("%s outcome could not be recorded: %w", o.Kind, err),
	}
	_, reviewErr := c.retryTransient(ctx, until, func(ctx context.Context) error {
		return c.finish(ctx, []Outcome{review}, written)
	})
	if reviewErr != nil {
		return fmt.Errorf("record outcome of %s: %w", o.Key, errors.Join(err, reviewErr))
	}
	return nil
}

// readBackRecorded marks as written the outcomes of outs that an earlier
// try wrote although its reply was lost.
func (c *Client[TTx]) readBackRecorded(ctx context.Context, until time.Time, outs []Outcome, written map[Key]bool) error {
	var attempts []store.AttemptRef
	for _, o := range outs {
		if !written[o.Key] {
			attempts = append(attempts, store.AttemptRef{Key: string(o.Key), Attempt: o.Attempt})
		}
	}
	if len(attempts) == 0 {
		return nil
	}
	_, err := c.retryTransient(ctx, until, func(ctx context.Context) error {
		keys, err := c.store.RecordedAttempts(ctx, attempts)
		for _, key := range keys {
			written[Key(key)] = true
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("read back recorded outcomes: %w", err)
	}
	return nil
}

// retryTransient runs try, each time under [Config.StatementTimeout], until
// it succeeds, fails for good, or until leaves no time for another try after
// the backoff. It reports whether a failed try may have run on the server.
func (c *Client[TTx]) retryTransient(ctx context.Context, until time.Time, try func(ctx context.Context) error) (mayHaveRun bool, err error) {
	wait := recordRetryMin
	for {
		tryCtx, cancel := c.statementContext(ctx)
		err = try(tryCtx)
		cancel()
		if err == nil || !store.IsTransient(err) || ctx.Err() != nil {
			return mayHaveRun, err
		}
		mayHaveRun = mayHaveRun || store.MayHaveRun(err)
		if time.Now().Add(wait).After(until) {
			return mayHaveRun, err
		}
		c.config.Logger.WarnContext(ctx, "pgonce: recording outcomes failed; trying again",
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

// statementContext bounds one statement pgonce runs on its own by
// [Config.StatementTimeout].
func (c *Client[TTx]) statementContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.config.StatementTimeout)
}

// finish writes final outcomes with OutboxFinish.
func (c *Client[TTx]) finish(ctx context.Context, outs []Outcome, written map[Key]bool) error {
	params := &store.FinishParams{Now: c.nowParam(), TombstoneRetention: c.config.TombstoneRetention}
	if !c.config.NotifyDisabled {
		params.Channel = c.store.DoneChannel
	}
	for _, o := range outs {
		params.Outcomes = append(params.Outcomes, store.Outcome{
			Key:       string(o.Key),
			Attempt:   o.Attempt,
			State:     o.Kind.dbState(),
			Response:  o.Response,
			Failure:   o.Failure,
			Retention: o.Retention,
			LastError: errorText(o.Err),
		})
	}
	keys, err := c.store.Finish(ctx, params)
	if err != nil {
		return fmt.Errorf("record outcomes: %w", err)
	}
	for _, key := range keys {
		written[Key(key)] = true
	}
	return nil
}

// release puts retryable attempts back to pending with OutboxRelease.
func (c *Client[TTx]) release(ctx context.Context, outs []Outcome, written map[Key]bool) error {
	params := &store.ReleaseParams{Now: c.nowParam()}
	if !c.config.NotifyDisabled {
		params.Channel = c.store.WorkChannel
	}
	for _, o := range outs {
		params.Releases = append(params.Releases, store.Release{
			Key:       string(o.Key),
			Attempt:   o.Attempt,
			Delay:     o.RetryDelay,
			Ambiguous: o.Ambiguous,
			LastError: errorText(o.Err),
		})
	}
	keys, err := c.store.Release(ctx, params)
	if err != nil {
		return fmt.Errorf("release attempts: %w", err)
	}
	for _, key := range keys {
		written[Key(key)] = true
	}
	return nil
}

// errorText is err's text, made safe to store (see [sanitizeText]).
func errorText(err error) string {
	if err == nil {
		return ""
	}
	return sanitizeText(err.Error())
}

// maxErrorTextBytes bounds the error text stored with a key.
const maxErrorTextBytes = 2048

// sanitizeText makes text that came from outside, such as a provider's
// error, safe to store in a text column: PostgreSQL rejects a NUL byte and
// invalid UTF-8 (SQLSTATE 22021), so both become U+FFFD, and text longer
// than maxErrorTextBytes is cut on a character boundary and ends in "…".
func sanitizeText(s string) string {
	if len(s) <= maxErrorTextBytes && utf8.ValidString(s) && !strings.ContainsRune(s, 0) {
		return s
	}
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
	if len(s) > maxErrorTextBytes {
		const ellipsis = "…"
		cut := maxErrorTextBytes - len(ellipsis)
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + ellipsis
	}
	return s
}
