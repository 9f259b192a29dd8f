package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/pgonce/pgonce/internal/store"
)

// SubmitManyResult is one call's answer from [Client.SubmitManyTx]: the
// Result and the error that [Client.SubmitTx] would have returned for that
// call alone, after the calls before it in the same batch. Err is nil, a
// [*KeyConflictError] (Result is zero) or an [*ExpiredError] (Result is the
// tombstone's).
type SubmitManyResult struct {
	Result Result
	Err    error
}

// CallError is returned by [Client.SubmitManyTx] and [Client.SubmitMany]
// for a batch in which one call is invalid: Index is its position in the
// batch and Err what [Client.SubmitTx] would have returned for it
// ([ErrInvalidCall], [ErrNotCanonical], [ErrUnknownTool], ...), which
// errors.Is and errors.As find through it. Nothing of the batch is
// written.
type CallError struct {
	Index int
	Err   error
}

// Error says which call is invalid and why.
func (e *CallError) Error() string { return fmt.Sprintf("call %d: %v", e.Index, e.Err) }

// Unwrap returns the call's own error.
func (e *CallError) Unwrap() error { return e.Err }

// SubmitManyTx claims the keys of calls inside tx, the caller's own
// transaction, with one INSERT for the whole batch: each call's answer is
// what [Client.SubmitTx] would have given it, submitted in the batch's order
// in the same transaction. A call whose key exists already answers by that
// key's state; a call repeated within the batch (the same key) answers as a
// replay of its first submission, pending and Created false; a call asking
// the step or business key of an earlier call of the batch with another
// tool or other arguments gets a [*KeyConflictError]. Those answers are per
// call, in the returned slice, one element per call in the same order;
// they write nothing and leave tx usable, as SubmitTx's do.
//
// Every call is validated before any SQL runs: an invalid one returns a
// [*CallError] naming its index, wrapping the error SubmitTx would have
// returned, and nothing of the batch is written. [ErrInvalidTx] is returned
// for a nil tx. The other errors, and what to do with tx after them, are
// SubmitTx's; after any of them, no element of the batch is written once tx
// rolls back.
//
// Keys are inserted in the order of their scopes, not of calls: two
// transactions that submit overlapping batches wait on each other's
// uncommitted keys in the same order, so they never deadlock. An empty
// batch runs no statement. Dispatchers are notified once for the batch.
func (c *Client[TTx]) SubmitManyTx(ctx context.Context, tx TTx, calls []Call) ([]SubmitManyResult, error) {
	if isNilTx(tx) {
		return nil, ErrInvalidTx
	}
	return c.submitMany(ctx, c.driver.UnwrapExecutor(tx), calls)
}

// SubmitMany is [Client.SubmitManyTx] on its own: the batch's insert
// commits by itself before SubmitMany returns.
func (c *Client[TTx]) SubmitMany(ctx context.Context, calls []Call) ([]SubmitManyResult, error) {
	return c.submitMany(ctx, c.store.Executor(), calls)
}

func (c *Client[TTx]) submitMany(ctx context.Context, exec store.Executor, calls []Call) ([]SubmitManyResult, error) {
	subs := make([]submission, len(calls))
	for i, call := range calls {
		sub, err := c.prepare(call)
		if err != nil {
			return nil, &CallError{Index: i, Err: err}
		}
		subs[i] = sub
	}
	if len(calls) == 0 {
		return nil, nil
	}
	// The first call of each scope is the one inserted; the others answer
	// by what the first left, as a second SubmitTx would.
	first := make(map[string]int, len(calls))
	var inserting []int
	for i, sub := range subs {
		if _, ok := first[sub.Scope]; !ok {
			first[sub.Scope] = i
			inserting = append(inserting, i)
		}
	}
	slices.SortFunc(inserting, func(a, b int) int { return strings.Compare(subs[a].Scope, subs[b].Scope) })

	results := make([]SubmitManyResult, len(calls))
	created := make([]bool, len(calls))
	// A conflicting row can vanish between the insert and the read (a
	// tombstone past its horizon, deleted); the next round inserts again.
	for range 3 {
		params := &store.InsertManyParams{Now: c.nowParam()}
		for _, i := range inserting {
			key := c.newKey(subs[i], calls[i])
			params.Keys = append(params.Keys, key)
		}
		var notifyWindow *notifyWindow
		if !c.config.NotifyDisabled {
			if notifyWindow = c.takeNotifyWindow(); notifyWindow != nil || c.config.NotifyCooldown <= 0 {
				params.Channel = c.store.WorkChannel
			}
		}
		inserted, err := exec.KeyInsertMany(ctx, params)
		if err != nil {
			c.returnNotifyWindow(notifyWindow)
			return nil, fmt.Errorf("claim keys: %w", err)
		}
		if len(inserted) == 0 {
			c.returnNotifyWindow(notifyWindow)
		}
		byKey := make(map[Key]*store.InsertedKey, len(inserted))
		for _, row := range inserted {
			byKey[Key(row.Key)] = row
		}
		for _, i := range inserting {
			row, ok := byKey[subs[i].Key]
			if !ok {
				continue
			}
			created[i] = true
			results[i].Result = Result{
				Key:        subs[i].Key,
				State:      StatePending,
				Created:    true,
				Tool:       calls[i].Tool,
				CreatedAt:  row.CreatedAt,
				UpdatedAt:  row.CreatedAt,
				RetryAfter: retryAfter(StatePending, row.Now, row.AvailableAt, nil),
			}
		}
		// Every call not created here answers by the row in its scope,
		// read in a new statement, which sees what this one inserted and
		// what other transactions committed meanwhile.
		var scopes []string
		for i := range calls {
			if !created[i] {
				scopes = append(scopes, subs[i].Scope)
			}
		}
		if len(scopes) == 0 {
			return results, nil
		}
		existing, err := exec.KeysByScope(ctx, slices.Compact(slices.Sorted(slices.Values(scopes))), c.nowParam())
		if err != nil {
			return nil, fmt.Errorf("read existing keys: %w", err)
		}
		byScope := make(map[string]*store.KeyRow, len(existing))
		for _, row := range existing {
			byScope[row.Scope] = row
		}
		inserting = inserting[:0]
		for i := range calls {
			if created[i] {
				continue
			}
			row, ok := byScope[subs[i].Scope]
			if !ok {
				if first[subs[i].Scope] == i {
					inserting = append(inserting, i)
				}
				continue
			}
			results[i].Result, results[i].Err = c.answerExisting(row, subs[i], calls[i])
		}
		if len(inserting) == 0 {
			return results, nil
		}
	}
	return nil, errors.New("claim keys: the conflicting rows kept changing")
}

// newKey is the pending row of a submitted call, as claim writes it.
func (c *Client[TTx]) newKey(sub submission, call Call) *store.NewKey {
	key := &store.NewKey{
		Key:         string(sub.Key),
		Scope:       sub.Scope,
		Tenant:      call.Tenant,
		RunID:       call.RunID,
		Step:        call.Step,
		BusinessKey: call.Key,
		Tool:        call.Tool,
		NaturalID:   call.NaturalID,
		Fingerprint: storedFingerprint(call, sub.derivation),
		Args:        sub.Args,
		Metadata:    sub.metadata,
		Delay:       call.Delay,
	}
	if sub.tool != nil {
		key.Delivery = sub.tool.Delivery
		key.KeyRetention = sub.tool.Opts.KeyRetention
	}
	if !call.NotBefore.IsZero() {
		key.NotBefore = ptr(call.NotBefore)
	}
	if call.Key != "" {
		key.RunID, key.Step = "", 0
	}
	return key
}

// answerExisting is what a submit of call gets from row, the key that holds
// call's scope: a tombstone's [*ExpiredError], a [*KeyConflictError] for
// another key or another request, or the key's result.
func (c *Client[TTx]) answerExisting(row *store.KeyRow, sub submission, call Call) (Result, error) {
	if row.State == dbStateExpired {
		return c.resultFromRow(row, false), &ExpiredError{Key: Key(row.Key), CompletedAt: derefTime(row.CompletedAt)}
	}
	if row.Key != string(sub.Key) || row.Fingerprint != storedFingerprint(call, sub.derivation) {
		return Result{}, &KeyConflictError{
			Key:                 sub.Key,
			ExistingKey:         Key(row.Key),
			Fingerprint:         sub.Fingerprint,
			ExistingFingerprint: row.Fingerprint,
			ExistingTool:        row.Tool,
		}
	}
	return c.resultFromRow(row, false), nil
}
