package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgonce/pgonce/internal/attempt"
	"github.com/pgonce/pgonce/internal/store"
)

// Do runs call inline, without a dispatcher: it claims the key in flight
// under [Config.Lease] and commits the claim, so the claim is durable before
// the effect; it then calls p (or, when p is nil, the tool's registered
// provider) under [Config.CallTimeout], records the outcome and returns it.
// call.Tool must be registered: its [Delivery] decides what an uncertain
// attempt means, for Do and for the reconciler after a crash.
//
// Concurrent Dos of one action make exactly one provider call. The others
// return [ErrInProgress] (an [*InProgressError] with a retry-after hint)
// together with a Result in [StatePending] or [StateInFlight]. A key already
// finished returns its stored outcome: succeeded with the response verbatim,
// failed with the stored failure (a nil error in both cases; see
// [Result.Replayed]), or needs review.
//
// A provider error wrapped with [Permanent] is stored as the key's failure and
// replayed forever. Any other error leaves the key pending and returns
// [ErrProviderFailed]: a running dispatcher retries it after backoff, and a
// later Do of the same call at once (the caller asked now, so Do claims a
// pending key whose backoff has not elapsed). An uncertain error (see
// [IsAmbiguous]), or a panic, which may come after the provider acted, does
// the same for [IdempotentByKey] tools, makes the next attempt look up first
// for [LookupByNaturalID] tools, and sends [AtMostOnce] tools to
// [StateNeedsReview].
//
// For a [Transactional] tool, Do opens a transaction of the client's type,
// calls the provider's CallTx in it ([TxProvider]; p, when not nil, must be
// one too, such as a [TxProviderFunc]), records the response in the same
// transaction and commits: the effect and the outcome commit together, or
// neither does, and a failed or interrupted attempt is never uncertain. A
// provider of another transaction type returns [ErrTxType] before anything
// runs; a provider that commits or rolls back the transaction itself sends
// the key to review and returns [ErrTxClosed]; a statement or lock timeout,
// or a call past [Config.CallTimeout], rolls back and returns
// [ErrProviderFailed] wrapping [ErrTxTimeout]. A COMMIT whose reply was
// lost is settled by reading the key back: the Result says whether it took.
//
// For a tool registered [ToolOpts.InlineOnly], Do is the only runner: no
// dispatcher claims its keys, so a key left pending (a provider error, or
// an expired lease the reconciler put back) runs again only at the next Do
// of the same call.
//
// A scheduled call ([Call.NotBefore] or [Call.Delay] in the future) is not
// run before its time: Do submits it pending, as [Client.Submit] would, and
// returns [ErrInProgress] with a pending Result whose RetryAfter says how
// long until it is due; a dispatcher runs it then, or a Do of the same call
// once it is due. Do never claims a key before the not-before time it was
// submitted with, whoever asks; a pending key waiting out a retry's backoff
// it claims at once. The provider receives the metadata stored with the key
// ([Request.Metadata]), that of the submit that created it.
//
// The claim runs under [Config.StatementTimeout]; recording the outcome is
// tried again after a transient failure, such as a killed connection, for up
// to 30s, past the lease if need be; the attempt fences the write, so a
// retry never writes twice, nor after the reconciler took the key over. If the process dies between the claim and
// the record, the key stays in flight until its lease expires and the
// reconciler resolves it.
func (c *Client[TTx]) Do(ctx context.Context, call Call, p Provider) (Result, error) {
	sub, err := c.prepare(call)
	if err != nil {
		return Result{}, err
	}
	d, tool := sub.derivation, sub.tool
	if tool != nil && tool.Delivery == Transactional {
		provider := p
		if provider == nil {
			provider = tool.Provider
		}
		if err := checkTxType[TTx](tool.Name, provider); err != nil {
			return Result{}, err
		}
	}
	claimedAt := time.Now()
	claimCtx, cancel := c.statementContext(ctx)
	res, row, err := c.claim(claimCtx, c.store.Executor(), sub, call, true)
	cancel()
	if err != nil {
		return res, err // an expired key's Result comes with ErrExpired
	}
	a := attempt.Attempt{
		Tool:    c.attemptTool(tool, p),
		Request: attempt.Request{Key: string(d.Key), NaturalID: call.NaturalID, Tool: call.Tool, Args: d.Args, Metadata: sub.metadata},
		Scope:   d.Scope,
		Lease:   c.config.Lease,
	}
	switch {
	case row != nil && row.LeaseUntil != nil:
		a.Request.Attempt = row.Attempt
		a.FirstAttemptedAt = row.CreatedAt
		a.ClaimedNow, a.ClaimedAt = row.Now, claimedAt
	case res.State == StatePending:
		// A submitted key no dispatcher has taken yet: take it here.
		claimedAt = time.Now()
		claimed, err := c.claimPending(ctx, d.Key, tool != nil && tool.Opts.ReplicatedClaim)
		if errors.Is(err, store.ErrNoRows) {
			// Not due yet (scheduled), or another claimer took it.
			current, err := c.inProgress(ctx, d.Key)
			current.Created = res.Created
			return current, err
		}
		if err != nil {
			return Result{}, err
		}
		a.Request.Attempt = claimed.Attempt
		a.Request.Metadata = claimed.Metadata
		a.Ambiguous = claimed.Ambiguous
		a.FirstAttemptedAt = claimed.FirstAttemptedAt
		a.ClaimedNow, a.ClaimedAt = claimed.Now, claimedAt
		res.State, res.Attempts = StateInFlight, claimed.Attempt
	case res.State == StateInFlight:
		return res, &InProgressError{Key: d.Key, RetryAfter: res.RetryAfter}
	default:
		return res, nil
	}

	out := c.attempts.Run(ctx, a, nil)
	written, err := c.attempts.Record(ctx, []attempt.Outcome{out})
	if err != nil {
		// The key stays in flight under its lease; the reconciler resolves it.
		return res, err
	}
	readCtx, cancel := c.statementContext(context.WithoutCancel(ctx))
	defer cancel()
	if !written[string(d.Key)] {
		// Our lease was taken over while the provider ran: report what the
		// store holds instead. (An outcome written by a try whose reply was
		// lost counts as written; see Record.)
		return c.get(readCtx, c.store.Executor(), d.Key)
	}
	// Read back what was recorded, so that timestamps come from the same
	// clock as every later Get.
	recorded, err := c.get(readCtx, c.store.Executor(), d.Key)
	if err != nil {
		return recorded, err
	}
	recorded.Created = res.Created
	switch {
	case out.Kind == attempt.Retry:
		return recorded, fmt.Errorf("%w: %w", ErrProviderFailed, out.Err)
	case errors.Is(out.Err, ErrTxClosed):
		return recorded, out.Err
	}
	return recorded, nil
}

func (c *Client[TTx]) claimPending(ctx context.Context, key Key, replicated bool) (*store.ClaimedKey, error) {
	ctx, cancel := c.statementContext(ctx)
	defer cancel()
	row, err := c.store.ClaimKey(ctx, &store.ClaimKeyParams{
		Key:        string(key),
		Lease:      c.config.Lease,
		Replicated: replicated,
		Worker:     c.config.WorkerID,
		Now:        c.nowParam(),
	})
	if err != nil && !errors.Is(err, store.ErrNoRows) {
		return nil, fmt.Errorf("claim pending key: %w", err)
	}
	return row, err
}

func (c *Client[TTx]) inProgress(ctx context.Context, key Key) (Result, error) {
	ctx, cancel := c.statementContext(ctx)
	defer cancel()
	res, err := c.get(ctx, c.store.Executor(), key)
	if err != nil {
		return res, err
	}
	if res.State.InProgress() {
		return res, &InProgressError{Key: key, RetryAfter: res.RetryAfter}
	}
	return res, nil
}
