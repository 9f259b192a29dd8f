package attempt

import (
	"context"
	"encoding/json"

	"github.com/pgonce/pgonce/internal/store"
)

// Op is one provider call or lookup as a [Tool.Wrap] hook sees it.
type Op struct {
	// Lookup is set for a lookup, clear for a provider call.
	Lookup bool
	// Request is what the provider receives.
	Request Request
	// Delivery is the tool's delivery for this attempt.
	Delivery store.Delivery
	// MaxAttempts is the attempt limit of the attempt; zero means none.
	MaxAttempts int
}

// CallResult is what a provider call or lookup returned.
type CallResult struct {
	Response json.RawMessage
	// Found is a lookup's answer.
	Found bool
	Err   error
}

// Outcome names.
const (
	OutcomeSucceeded   = "succeeded"
	OutcomeFailed      = "failed"
	OutcomeRetry       = "retry"
	OutcomeAmbiguous   = "ambiguous"
	OutcomeNeedsReview = "needs_review"
	OutcomeFound       = "found"
	OutcomeNotFound    = "not_found"
)

// Outcome names what res makes of op, as [Runner.Run] and [Runner.Settle]
// decide it, given classify to tell errors apart: succeeded, failed, retry,
// ambiguous (tried again, its effect unknown) or needs_review for a call;
// found, not_found, failed, ambiguous (a lookup that failed: the effect is
// still unknown) or needs_review for a lookup.
func (op *Op) Outcome(res CallResult, classify func(error) ErrorKind) string {
	atLimit := op.MaxAttempts > 0 && op.Request.Attempt >= op.MaxAttempts
	if op.Lookup {
		switch {
		case res.Err == nil && res.Found:
			return OutcomeFound
		case res.Err == nil:
			return OutcomeNotFound
		case classify(res.Err) == Permanent:
			return OutcomeFailed
		case atLimit && op.Delivery != store.DeliveryByKey:
			return OutcomeNeedsReview
		case atLimit:
			return OutcomeFailed
		}
		// The earlier attempt's effect is still unknown.
		return OutcomeAmbiguous
	}
	if res.Err == nil {
		return OutcomeSucceeded
	}
	switch kind := classify(res.Err); {
	case kind == Permanent:
		return OutcomeFailed
	case kind == Ambiguous && op.Delivery != store.DeliveryTransactional:
		// A transactional tool's failed call rolled back: it is never
		// uncertain.
		switch {
		case op.Delivery == store.DeliveryAtMostOnce, atLimit && op.Delivery != store.DeliveryByKey:
			return OutcomeNeedsReview
		case atLimit:
			return OutcomeFailed
		}
		return OutcomeAmbiguous
	}
	if atLimit {
		return OutcomeFailed
	}
	return OutcomeRetry
}

// wrapped runs inner through tool's [Tool.Wrap] hook, when it has one.
func wrapped(ctx context.Context, tool *Tool, op *Op, inner func(ctx context.Context) CallResult) CallResult {
	if tool.Wrap == nil {
		return inner(ctx)
	}
	return tool.Wrap(ctx, op, inner)
}
