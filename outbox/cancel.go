package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pgonce/pgonce/internal/observe"
	"github.com/pgonce/pgonce/internal/store"
)

// CancelParams say who cancels a key and why, for [Client.Cancel].
type CancelParams struct {
	// By names who decided. Required: at most 2000 bytes of valid UTF-8,
	// without NUL bytes.
	By string
	// Reason says why. Required, with the same rules as By.
	Reason string
}

// RetryParams say who retries a key and why, for [Client.Retry].
type RetryParams struct {
	// By names who decided. Required: at most 2000 bytes of valid UTF-8,
	// without NUL bytes.
	By string
	// Reason says why. Required, with the same rules as By.
	Reason string
}

// KeyStateError details an [ErrNotCancellable] or [ErrNotRetryable]: the
// key's state did not allow the operation.
type KeyStateError struct {
	// Op is the refused operation: "cancel" or "retry".
	Op string
	// Key is the key.
	Key Key
	// State is the key's state when the operation was refused.
	State State

	err error
}

// Error names the operation and the key's state.
func (e *KeyStateError) Error() string {
	switch e.Op {
	case "cancel":
		return fmt.Sprintf("cannot cancel key %s: it is %s, not pending", e.Key, e.State)
	default:
		return fmt.Sprintf("cannot retry key %s: it is %s, neither failed nor cancelled", e.Key, e.State)
	}
}

// Unwrap returns [ErrNotCancellable] or [ErrNotRetryable].
func (e *KeyStateError) Unwrap() error { return e.err }

// Cancel cancels a pending key: the action does not run, the key becomes
// final in [StateCancelled], and every duplicate submit, Do, Get or Wait
// answers with the cancellation (nothing runs) until an operator retries
// it. The decision is recorded with who and why, like a resolution (see
// [Client.Inspect]), and the key's retention starts as if it had finished.
//
// Only a pending key can be cancelled: a key an attempt holds in flight is
// never touched, whatever its provider is doing, and a cancel that races a
// claim either wins (the attempt never starts) or is refused. A pending key
// whose earlier attempt was uncertain (its provider may have acted) is
// cancelled like any other: the cancellation stops further attempts, and
// cannot undo one.
//
// It returns [ErrInvalidParams] for missing or malformed params,
// [ErrNotFound] for an unknown key, [ErrExpired] for a pruned one and
// [ErrNotCancellable] (a [*KeyStateError]) for a key in any other state;
// none of these changes anything.
func (c *Client[TTx]) Cancel(ctx context.Context, key Key, params CancelParams) (Result, error) {
	return c.operated(ctx, "cancel", key, "", func() (Result, error) {
		return c.cancel(ctx, key, params)
	})
}

func (c *Client[TTx]) cancel(ctx context.Context, key Key, params CancelParams) (Result, error) {
	if _, err := ParseKey(string(key)); err != nil {
		return Result{}, err
	}
	if err := validateAudit(params.By, params.Reason); err != nil {
		return Result{}, err
	}
	p := &store.AuditParams{
		Key:                string(key),
		ResolvedBy:         params.By,
		Reason:             params.Reason,
		Retention:          c.config.Retention,
		TombstoneRetention: c.config.TombstoneRetention,
		Now:                c.nowParam(),
	}
	if !c.config.NotifyDisabled {
		p.Channel = c.store.DoneChannel
	}
	// The tool is read before the statement, on a connection of its own,
	// for its retention.
	tool, err := c.toolOf(ctx, key)
	if err != nil {
		return Result{}, fmt.Errorf("cancel key: %w", err)
	}
	if t := c.config.Registry.Lookup(tool); t != nil && t.Opts.Retention > 0 {
		p.Retention = t.Opts.Retention
	}
	return c.audited(ctx, key, "cancel", ErrNotCancellable, func() error { return c.store.Cancel(ctx, p) })
}

// Retry sends a failed or cancelled key back to pending, due now: a
// dispatcher (or a Do of the same call) runs it again under a new attempt,
// with the same key, and the stored failure is dropped. The decision is
// recorded with who and why (see [Client.Inspect]). A needs-review key is
// retried with [Client.Resolve] and [ResolveRetry] instead. The provider
// sees the same key again: one that keeps its answer per key (Stripe does
// for 24 hours) may answer with the failure it gave the first time.
//
// It returns [ErrInvalidParams] for missing or malformed params,
// [ErrNotFound] for an unknown key, [ErrExpired] for a pruned one and
// [ErrNotRetryable] (a [*KeyStateError]) for a key in any other state, a
// pending or in-flight one included; none of these changes anything.
func (c *Client[TTx]) Retry(ctx context.Context, key Key, params RetryParams) (Result, error) {
	return c.operated(ctx, "retry", key, "", func() (Result, error) {
		return c.retry(ctx, key, params)
	})
}

func (c *Client[TTx]) retry(ctx context.Context, key Key, params RetryParams) (Result, error) {
	if _, err := ParseKey(string(key)); err != nil {
		return Result{}, err
	}
	if err := validateAudit(params.By, params.Reason); err != nil {
		return Result{}, err
	}
	p := &store.AuditParams{
		Key:        string(key),
		ResolvedBy: params.By,
		Reason:     params.Reason,
		Now:        c.nowParam(),
	}
	if !c.config.NotifyDisabled {
		p.Channel = c.store.WorkChannel
	}
	return c.audited(ctx, key, "retry", ErrNotRetryable, func() error { return c.store.Retry(ctx, p) })
}

// operated runs an operator's resolve, cancel or retry (name) of key, and
// tells the client's observer of it.
func (c *Client[TTx]) operated(ctx context.Context, name string, key Key, action string, op func() (Result, error)) (Result, error) {
	if c.observer == nil {
		return op()
	}
	began := time.Now()
	res, err := op()
	c.observer.Operated(ctx, &observe.Operation{
		Began: began, Ended: time.Now(),
		Name: name, Key: string(key), Action: action, State: string(res.State), Err: err,
	})
	return res, err
}

// audited runs an audited state change and reads the key back; a change
// the key's state refused returns a [*KeyStateError] with the state read.
func (c *Client[TTx]) audited(ctx context.Context, key Key, op string, refused error, change func() error) (Result, error) {
	err := change()
	if err != nil && !errors.Is(err, store.ErrNoRows) {
		return Result{}, fmt.Errorf("%s key: %w", op, err)
	}
	res, getErr := c.Get(ctx, key)
	if getErr != nil {
		return res, getErr
	}
	if errors.Is(err, store.ErrNoRows) {
		return res, &KeyStateError{Op: op, Key: key, State: res.State, err: refused}
	}
	return res, nil
}

// auditTextMaxBytes bounds By and Reason, as [Resolution]'s.
const auditTextMaxBytes = 2000

func validateAudit(by, reason string) error {
	for _, field := range [...]struct{ name, value string }{{"By", by}, {"Reason", reason}} {
		switch {
		case strings.TrimSpace(field.value) == "":
			return fmt.Errorf("%w: %s is required", ErrInvalidParams, field.name)
		case len(field.value) > auditTextMaxBytes:
			return fmt.Errorf("%w: %s must be at most %d bytes", ErrInvalidParams, field.name, auditTextMaxBytes)
		case !utf8.ValidString(field.value):
			return fmt.Errorf("%w: %s must be valid UTF-8", ErrInvalidParams, field.name)
		case strings.IndexByte(field.value, 0) >= 0:
			// PostgreSQL text cannot hold NUL (SQLSTATE 22021).
			return fmt.Errorf("%w: %s must not contain NUL bytes", ErrInvalidParams, field.name)
		}
	}
	return nil
}
