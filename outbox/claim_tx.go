package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/pgonce/pgonce/internal/store"
)

// ClaimTx claims call's key in flight in the caller's transaction tx, for an
// action whose effect is tx's own writes (an HTTP handler's rows in the same
// database): do the work in tx, then record its response with
// [Client.CompleteTx] in tx and commit. The claim, the effect and the
// response commit together, or, rolled back, none of them exists.
//
// A Result in [StateInFlight] with Created set is this transaction's claim.
// A key that already exists answers as [Client.SubmitTx] does: its Result
// (a finished key's stored outcome, replayed) with a nil error, or, pending
// or in flight elsewhere, [ErrInProgress]. A concurrent transaction that
// claimed the same key and has not committed makes ClaimTx wait until it
// ends, as SubmitTx does; the waiter then sees the winner's outcome.
//
// A claim left in flight by a transaction that commits without CompleteTx
// is resolved, once its lease expires, by the reconciler by its tool's
// [Delivery], like any abandoned attempt. A scheduled call (NotBefore or
// Delay) returns [ErrInvalidCall]: the work happens now or not at all.
func (c *Client[TTx]) ClaimTx(ctx context.Context, tx TTx, call Call) (Result, error) {
	if isNilTx(tx) {
		return Result{}, ErrInvalidTx
	}
	if call.scheduled() {
		return Result{}, fmt.Errorf("%w: ClaimTx claims now; NotBefore and Delay must be zero", ErrInvalidCall)
	}
	sub, err := c.prepare(call)
	if err != nil {
		return Result{}, err
	}
	res, row, err := c.claim(ctx, c.driver.UnwrapExecutor(tx), sub, call, true)
	if err != nil {
		return res, err
	}
	switch {
	case row != nil && row.LeaseUntil != nil:
		res.State, res.Attempts, res.Created = StateInFlight, row.Attempt, true
		return res, nil
	case res.State == StatePending || res.State == StateInFlight:
		return res, &InProgressError{Key: res.Key, RetryAfter: res.RetryAfter}
	}
	return res, nil
}

// CompleteTx records response as the outcome of the key that [Client.ClaimTx]
// claimed in the same transaction tx: claimed is ClaimTx's Result. The key
// is [StateSucceeded] with response, stored and replayed byte for byte,
// once tx commits. It returns [ErrNotClaimed] for a Result that is not
// tx's own claim (another transaction's, or one already completed), and
// writes nothing.
func (c *Client[TTx]) CompleteTx(ctx context.Context, tx TTx, claimed Result, response json.RawMessage) (Result, error) {
	if isNilTx(tx) {
		return Result{}, ErrInvalidTx
	}
	if !claimed.Created || claimed.State != StateInFlight {
		return Result{}, fmt.Errorf("%w: key %s is not this transaction's in-flight claim", ErrNotClaimed, claimed.Key)
	}
	if response == nil {
		response = json.RawMessage{}
	}
	retention := c.config.Retention
	if tool := c.config.Registry.Lookup(claimed.Tool); tool != nil {
		retention = cmp.Or(tool.Opts.Retention, retention)
	}
	exec := c.driver.UnwrapExecutor(tx)
	err := exec.KeyCompleteInTx(ctx, &store.CompleteInTxParams{
		Key:                string(claimed.Key),
		Attempt:            claimed.Attempts,
		Worker:             c.config.WorkerID,
		State:              dbStateSucceeded,
		Response:           response,
		Retention:          retention,
		TombstoneRetention: c.config.TombstoneRetention,
		Now:                c.nowParam(),
	})
	if errors.Is(err, store.ErrNoRows) {
		return Result{}, fmt.Errorf("%w: key %s is not held by this transaction", ErrNotClaimed, claimed.Key)
	}
	if err != nil {
		return Result{}, fmt.Errorf("complete key: %w", err)
	}
	res, err := c.get(ctx, exec, claimed.Key)
	res.Created = true
	return res, err
}
