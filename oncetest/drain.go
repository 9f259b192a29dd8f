package oncetest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/attempt"
	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/outbox"
)

// DrainMaxCallsDefault is how many attempts [Drain] makes at most, unless
// [DrainOpts.MaxCalls] says otherwise.
const DrainMaxCallsDefault = 1000

// drainBatchSize is how many due keys one claim of Drain takes.
const drainBatchSize = 100

// DrainOpts are the optional parameters of [Drain]; nil means the defaults.
type DrainOpts struct {
	// MaxAttempts is the attempt after which a retryable failure becomes
	// final, as [dispatcher.Config.MaxAttempts]. Defaults to
	// [dispatcher.MaxAttemptsDefault].
	MaxAttempts int

	// BackoffFunc returns the delay before the retry that follows attempt
	// (from 1). Defaults to [dispatcher.BackoffMinDefault] doubled at
	// every attempt up to [dispatcher.BackoffMaxDefault], without the
	// dispatcher's jitter, so that a test knows how far to move its
	// [Clock]: 1s after the first attempt, 2s after the second.
	BackoffFunc func(attempt int) time.Duration

	// MaxCalls bounds the attempts one Drain makes; past it Drain returns
	// [ErrDrainLimit]. Defaults to [DrainMaxCallsDefault].
	MaxCalls int
}

// DrainResult says what [Drain] did. Keys lists the keys it attempted, in
// the order it attempted them (a key retried within one Drain, after a
// zero backoff, appears once per attempt); the counts say how the
// attempts ended.
type DrainResult struct {
	Keys        []outbox.Key
	Succeeded   int
	Failed      int
	NeedsReview int
	Retried     int
}

// Attempts returns how many attempts Drain made.
func (r DrainResult) Attempts() int { return len(r.Keys) }

// Drain runs the due calls of client's registered tools synchronously, in
// the calling goroutine, until none is due, and returns what it did. It
// claims due pending keys through the claim a dispatcher makes (FOR UPDATE
// SKIP LOCKED, under the client's lease, committed before any provider is
// called), calls each key's provider in turn under the client's
// CallTimeout, and records each outcome before the next call, so a
// provider that submits calls of its own sees them run in the same Drain.
//
// Drain honours each tool's flow control as a dispatcher does (see
// [outbox.Client.Pause] and [outbox.Client.SetToolLimits]): a paused tool's
// keys stay pending; a tool with a limit on calls in flight or a rate is
// claimed within that budget, so that a rate with burst N at a [Clock]
// that stands still lets one Drain make N calls of the tool and leaves the
// rest pending; and a tool slowed down is not claimed before its slow-down
// ends. A provider that answers [outbox.SlowDown] under Drain slows its
// tool down, and its key goes back to pending without spending its
// attempt. Flow control is read again at every claim, so a pause or limit
// that a provider sets within the Drain counts from the next claim on.
// Claims of [outbox.ToolOpts.ReplicatedClaim] tools commit as a
// dispatcher's do, once the synchronous standbys applied them.
//
// Due means by the client's clock: [outbox.Config.NowFunc] when set (a
// [Clock]), else the database's. A call that fails and is retried becomes
// due again after its backoff, so it stays pending when Drain returns;
// keys of tools the client does not register are left alone, and so are
// keys of [outbox.ToolOpts.InlineOnly] tools, which, as with a dispatcher,
// only their callers' [outbox.Client.Do] runs.
//
// Drain returns [ErrInvalidOpts] for a nil client, a client not made by
// [outbox.New] or [outbox.NewPgx], or negative options,
// [ErrDrainLimit] after opts.MaxCalls attempts with calls still due, and
// an error wrapping the database's when a claim or a record fails. An
// attempt already made when it fails stays recorded.
func Drain[TTx any](ctx context.Context, client *outbox.Client[TTx], opts *DrainOpts) (DrainResult, error) {
	if client == nil {
		return DrainResult{}, fmt.Errorf("%w: client must not be nil", ErrInvalidOpts)
	}
	o, err := opts.withDefaults()
	if err != nil {
		return DrainResult{}, err
	}
	config := client.Config()
	runner, err := attempt.Of(client)
	if err != nil {
		return DrainResult{}, fmt.Errorf("%w: client: %w", ErrInvalidOpts, err)
	}
	// The claims are a dispatcher's (see [attempt.Claimer]): a paused tool's
	// keys stay pending, a limited tool's are claimed within its budget, a
	// replicated tool's claims wait for the standbys. Flow control is read
	// at every claim, so a change a provider makes within the Drain counts.
	claimer := runner.NewClaimer(attempt.ClaimerConfig{
		Worker:      ident.WorkerID(config.WorkerID),
		MaxAttempts: o.MaxAttempts,
	})
	tools := config.Registry.Dispatched()

	var result DrainResult
	for {
		if len(tools) == 0 {
			return result, nil
		}
		// ClaimAt 1: a tool out of rate tokens is left out of the Drain's
		// next claims until one has accrued, not a batch's worth.
		claimed, _, err := claimer.Claim(ctx, &attempt.ClaimParams{
			Tools:   tools,
			Limit:   min(drainBatchSize, o.MaxCalls-len(result.Keys)+1),
			ClaimAt: 1,
		})
		if err != nil {
			// Keys claimed before the claim failed go back to pending.
			return result, errors.Join(fmt.Errorf("claim due calls: %w", err), release(ctx, runner, claimed))
		}
		if len(claimed) == 0 {
			return result, nil
		}
		for i, a := range claimed {
			if len(result.Keys) == o.MaxCalls {
				// The claims not run go back to pending at once: a test
				// that drains again finds them due.
				if err := release(ctx, runner, claimed[i:]); err != nil {
					return result, err
				}
				return result, fmt.Errorf("%w: %d attempts", ErrDrainLimit, o.MaxCalls)
			}
			out := runner.Run(ctx, a, o.BackoffFunc)
			if err := record(ctx, runner, claimer, &out); err != nil {
				return result, err
			}
			result.Keys = append(result.Keys, outbox.Key(a.Request.Key))
			switch out.Kind {
			case attempt.Succeeded:
				result.Succeeded++
			case attempt.Failed:
				result.Failed++
			case attempt.NeedsReview:
				result.NeedsReview++
			case attempt.Retry:
				result.Retried++
			}
		}
	}
}

func (o *DrainOpts) withDefaults() (DrainOpts, error) {
	var d DrainOpts
	if o != nil {
		d = *o
	}
	switch {
	case d.MaxAttempts < 0:
		return d, fmt.Errorf("%w: MaxAttempts must not be negative", ErrInvalidOpts)
	case d.MaxCalls < 0:
		return d, fmt.Errorf("%w: MaxCalls must not be negative", ErrInvalidOpts)
	}
	if d.MaxAttempts == 0 {
		d.MaxAttempts = dispatcher.MaxAttemptsDefault
	}
	if d.MaxCalls == 0 {
		d.MaxCalls = DrainMaxCallsDefault
	}
	if d.BackoffFunc == nil {
		d.BackoffFunc = backoffDefault
	}
	return d, nil
}

// backoffDefault doubles from the dispatcher's minimum to its maximum.
func backoffDefault(attempt int) time.Duration {
	delay := dispatcher.BackoffMinDefault
	for i := 1; i < attempt && delay < dispatcher.BackoffMaxDefault; i++ {
		delay *= 2
	}
	return min(delay, dispatcher.BackoffMaxDefault)
}

// record records out, and first applies a provider's slow down of it as a
// dispatcher does: the tool is slowed down, and a retried key goes back to
// pending without spending its attempt.
func record(ctx context.Context, runner *attempt.Runner, claimer *attempt.Claimer, out *attempt.Outcome) error {
	if out.SlowDown > 0 {
		// When the slow down cannot be written, the outcome is recorded
		// as an ordinary retry, after its delay, as a dispatcher's is.
		if res, err := claimer.Throttle(ctx, out); err == nil && out.Kind == attempt.Retry && res.Released {
			return nil
		}
	}
	if _, err := runner.Record(ctx, []attempt.Outcome{*out}); err != nil {
		return fmt.Errorf("record outcome of %s: %w", out.Key, err)
	}
	return nil
}

// release puts claimed keys that Drain will not run back to pending, due
// at once. Their claim took an attempt number, which stays taken (the
// fence needs it): the next attempt of such a key counts one more.
func release(ctx context.Context, runner *attempt.Runner, claimed []attempt.Attempt) error {
	if len(claimed) == 0 {
		return nil
	}
	outs := make([]attempt.Outcome, 0, len(claimed))
	for _, a := range claimed {
		out := runner.NewOutcome(a)
		out.Kind, out.Ambiguous, out.Err = attempt.Retry, a.Ambiguous, errReleased
		outs = append(outs, out)
	}
	if _, err := runner.Record(ctx, outs); err != nil {
		return fmt.Errorf("release claims left by the drain: %w", err)
	}
	return nil
}

// errReleased is the last error of a key released unrun.
var errReleased = errors.New("oncetest: claimed but not run: Drain reached MaxCalls")
