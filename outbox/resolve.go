package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pgonce/pgonce/internal/store"
)

// ResolutionAction is an operator's decision on a needs-review key.
type ResolutionAction string

const (
	// ResolveSucceeded records that the action happened, with a response.
	ResolveSucceeded ResolutionAction = "succeeded"
	// ResolveFailed records that the action did not happen and must not be
	// retried, with a failure.
	ResolveFailed ResolutionAction = "failed"
	// ResolveRetry sends the key back to pending: the action did not happen
	// and may run again. [Client.Retry] records it too.
	ResolveRetry ResolutionAction = "retry"
	// ResolveCancel is recorded by [Client.Cancel]; [Client.Resolve] does
	// not take it.
	ResolveCancel ResolutionAction = "cancel"
)

// Resolution is an operator's decision on a key in [StateNeedsReview].
type Resolution struct {
	// Action is what was decided.
	Action ResolutionAction
	// Response is stored as the key's response for [ResolveSucceeded]; it
	// must be valid JSON and is replayed verbatim.
	Response json.RawMessage
	// Failure is stored as the key's failure for [ResolveFailed]; it must be
	// valid JSON.
	Failure json.RawMessage
	// By names who decided. Required: at most 2000 bytes of valid UTF-8,
	// without NUL bytes.
	By string
	// Reason says why. Required: at most 2000 bytes of valid UTF-8, without
	// NUL bytes.
	Reason string
}

// NotNeedsReviewError details an [ErrNotNeedsReview].
type NotNeedsReviewError struct {
	Key   Key
	State State
}

// Error names the key's state.
func (e *NotNeedsReviewError) Error() string {
	return fmt.Sprintf("key %s is %s, not needs_review", e.Key, e.State)
}

// Is matches [ErrNotNeedsReview].
func (e *NotNeedsReviewError) Is(target error) bool { return target == ErrNotNeedsReview }

// resolutionTextMaxBytes bounds By and Reason.
const resolutionTextMaxBytes = 2000

func (r Resolution) validate() error {
	switch r.Action {
	case ResolveSucceeded:
		if !json.Valid(r.Response) {
			return fmt.Errorf("%w: Response must be valid JSON for %s", ErrInvalidResolution, r.Action)
		}
		if r.Failure != nil {
			return fmt.Errorf("%w: Failure must be empty for %s", ErrInvalidResolution, r.Action)
		}
	case ResolveFailed:
		if !json.Valid(r.Failure) {
			return fmt.Errorf("%w: Failure must be valid JSON for %s", ErrInvalidResolution, r.Action)
		}
		if r.Response != nil {
			return fmt.Errorf("%w: Response must be empty for %s", ErrInvalidResolution, r.Action)
		}
	case ResolveRetry:
		if r.Response != nil || r.Failure != nil {
			return fmt.Errorf("%w: Response and Failure must be empty for %s", ErrInvalidResolution, r.Action)
		}
	default:
		return fmt.Errorf("%w: Action must be succeeded, failed or retry, got %q", ErrInvalidResolution, r.Action)
	}
	for _, field := range [...]struct{ name, value string }{{"By", r.By}, {"Reason", r.Reason}} {
		if strings.TrimSpace(field.value) == "" {
			return fmt.Errorf("%w: %s is required", ErrInvalidResolution, field.name)
		}
		if len(field.value) > resolutionTextMaxBytes {
			return fmt.Errorf("%w: %s must be at most %d bytes", ErrInvalidResolution, field.name, resolutionTextMaxBytes)
		}
		if !utf8.ValidString(field.value) {
			return fmt.Errorf("%w: %s must be valid UTF-8", ErrInvalidResolution, field.name)
		}
		// PostgreSQL text cannot hold NUL (SQLSTATE 22021).
		if strings.IndexByte(field.value, 0) >= 0 {
			return fmt.Errorf("%w: %s must not contain NUL bytes", ErrInvalidResolution, field.name)
		}
	}
	return nil
}

// Resolve applies an operator's decision to a key in [StateNeedsReview] and
// records it (action, who, why, when) alongside the key; see
// [Client.Inspect]. [ResolveSucceeded] and [ResolveFailed] make the key final
// with the given bytes, replayed verbatim from then on; [ResolveRetry] sends
// it back to pending for a dispatcher.
//
// It returns [ErrInvalidResolution] for a malformed resolution, [ErrNotFound]
// for an unknown key, [ErrExpired] for a pruned one and [ErrNotNeedsReview]
// for a key in any other state; none of these changes anything.
func (c *Client[TTx]) Resolve(ctx context.Context, key Key, resolution Resolution) (Result, error) {
	return c.operated(ctx, "resolve", key, string(resolution.Action), func() (Result, error) {
		return c.resolve(ctx, key, resolution)
	})
}

func (c *Client[TTx]) resolve(ctx context.Context, key Key, resolution Resolution) (Result, error) {
	if _, err := ParseKey(string(key)); err != nil {
		return Result{}, err
	}
	if err := resolution.validate(); err != nil {
		return Result{}, err
	}
	params := &store.ResolveParams{
		Key:                string(key),
		Action:             string(resolution.Action),
		Response:           resolution.Response,
		Failure:            resolution.Failure,
		Now:                c.nowParam(),
		Retention:          c.config.Retention,
		TombstoneRetention: c.config.TombstoneRetention,
		ResolvedBy:         resolution.By,
		Reason:             resolution.Reason,
	}
	if !c.config.NotifyDisabled {
		params.Channel = c.store.DoneChannel
		if resolution.Action == ResolveRetry {
			params.Channel = c.store.WorkChannel
		}
	}
	// The tool is read before the statement, on a connection of its own:
	// no operation holds a connection while another waits for one.
	tool, err := c.toolOf(ctx, key)
	if err != nil {
		return Result{}, fmt.Errorf("resolve key: %w", err)
	}
	if t := c.config.Registry.Lookup(tool); t != nil && t.Opts.Retention > 0 {
		params.Retention = t.Opts.Retention
	}
	err = c.store.Resolve(ctx, params)
	if err != nil && !errors.Is(err, store.ErrNoRows) {
		return Result{}, fmt.Errorf("resolve key: %w", err)
	}
	res, getErr := c.Get(ctx, key)
	if getErr != nil {
		return res, getErr
	}
	if errors.Is(err, store.ErrNoRows) {
		return res, &NotNeedsReviewError{Key: key, State: res.State}
	}
	return res, nil
}

// toolOf returns key's tool, or the errors of [Client.Get].
func (c *Client[TTx]) toolOf(ctx context.Context, key Key) (string, error) {
	res, err := c.Get(ctx, key)
	if err != nil {
		return "", err
	}
	return res.Tool, nil
}

// ResolutionRecord is one recorded operator decision.
type ResolutionRecord struct {
	Action     ResolutionAction `json:"action"`
	By         string           `json:"by"`
	Reason     string           `json:"reason"`
	ResolvedAt time.Time        `json:"resolved_at"`
}
