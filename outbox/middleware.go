package outbox

import (
	"context"
	"encoding/json"

	"github.com/pgonce/pgonce/internal/attempt"
)

// Middleware wraps the provider calls and lookups of a client, for timing,
// tracing, logging, adding to the context, or refusing a call. Register it
// for every tool in [Config.Middleware], or for one in [ToolOpts.Middleware];
// it then runs around every call and lookup of [Client.Do], of dispatchers
// and of reconcilers over the client.
//
// AroundProvider calls next, at most once, to go on toward the provider
// (with a context of its own, say one carrying a span) and returns what it
// returns, or a result of its own. To refuse a call, it returns a result
// whose Err says why without calling next: the attempt then ends as though
// the provider had returned that error, so a plain error is tried again
// after backoff and one wrapped with [Permanent] fails the key for good.
// Never refuse with an error that [IsAmbiguous] reports, which would send an
// at-most-once tool to review for a call that never happened. A panic in
// AroundProvider counts as the provider's. It runs under
// [Config.CallTimeout], and may be called concurrently.
type Middleware interface {
	AroundProvider(ctx context.Context, call *ProviderCall, next func(ctx context.Context) ProviderResult) ProviderResult
}

// MiddlewareFunc adapts a function to [Middleware].
type MiddlewareFunc func(ctx context.Context, call *ProviderCall, next func(ctx context.Context) ProviderResult) ProviderResult

// AroundProvider calls f.
func (f MiddlewareFunc) AroundProvider(ctx context.Context, call *ProviderCall, next func(ctx context.Context) ProviderResult) ProviderResult {
	return f(ctx, call, next)
}

// ProviderOp says what a [ProviderCall] asks of the provider.
type ProviderOp int

const (
	// ProviderOpCall is a provider call, [Provider.Call].
	ProviderOpCall ProviderOp = iota
	// ProviderOpLookup is a lookup, [Lookuper.Lookup], made after an
	// attempt whose outcome is unknown.
	ProviderOpLookup
)

// String returns the operation's name: "call" or "lookup".
func (op ProviderOp) String() string {
	if op == ProviderOpLookup {
		return "lookup"
	}
	return "call"
}

// ProviderCall is one provider call or lookup, as a [Middleware] sees it.
// It must not be changed.
type ProviderCall struct {
	// Op says whether this is a call or a lookup.
	Op ProviderOp
	// Request is what the provider receives: the key, tool, natural id,
	// arguments, attempt number (from 1) and the call's metadata.
	Request Request
	// Delivery is the tool's delivery for this attempt: the one stored with
	// the key when it was submitted.
	Delivery Delivery
}

// ProviderResult is what a provider call or lookup returned, as a
// [Middleware] sees it.
type ProviderResult struct {
	// Response is the provider's response, or the response a lookup found.
	Response json.RawMessage
	// Found is a lookup's answer: whether the action happened.
	Found bool
	// Err is the provider's error.
	Err error
	// Outcome is what the attempt makes of the result that next returned;
	// it is set by pgonce, and ignored in a result a middleware returns.
	Outcome ProviderOutcome
}

// ProviderOutcome names what an attempt makes of a provider's answer.
type ProviderOutcome string

// Provider outcomes.
const (
	// ProviderSucceeded: the call returned a response, to be stored.
	ProviderSucceeded ProviderOutcome = "succeeded"
	// ProviderFailed: a permanent failure, or the attempt limit was reached;
	// the failure is stored.
	ProviderFailed ProviderOutcome = "failed"
	// ProviderRetry: a failure that changed nothing; the key is tried again
	// after backoff.
	ProviderRetry ProviderOutcome = "retry"
	// ProviderAmbiguous: the effect may or may not have happened (a call's
	// uncertain failure, or a lookup that failed); the key is tried again as
	// its [Delivery] allows.
	ProviderAmbiguous ProviderOutcome = "ambiguous"
	// ProviderNeedsReview: nobody can tell whether the effect happened; the
	// key goes to [StateNeedsReview].
	ProviderNeedsReview ProviderOutcome = "needs_review"
	// ProviderFound: a lookup found the action; its response is stored.
	ProviderFound ProviderOutcome = "found"
	// ProviderNotFound: a lookup found nothing; the provider is called.
	ProviderNotFound ProviderOutcome = "not_found"
)

// wrapFunc composes the client's and the tool's middleware, outermost
// first, as the attempt machinery's hook; nil when there is none.
func wrapFunc(client, tool []Middleware) func(ctx context.Context, op *attempt.Op, next func(ctx context.Context) attempt.CallResult) attempt.CallResult {
	chain := make([]Middleware, 0, len(client)+len(tool))
	chain = append(append(chain, client...), tool...)
	if len(chain) == 0 {
		return nil
	}
	return func(ctx context.Context, op *attempt.Op, next func(ctx context.Context) attempt.CallResult) attempt.CallResult {
		call := &ProviderCall{Request: providerRequest(op.Request), Delivery: op.Delivery}
		if op.Lookup {
			call.Op = ProviderOpLookup
		}
		provider := func(ctx context.Context) ProviderResult {
			got := next(ctx)
			return ProviderResult{
				Response: got.Response, Found: got.Found, Err: got.Err,
				Outcome: ProviderOutcome(op.Outcome(got, classifyError)),
			}
		}
		var res ProviderResult
		if len(chain) == 1 {
			// The common case, without the closures of a longer chain.
			res = chain[0].AroundProvider(ctx, call, provider)
		} else {
			// inner(i) runs the chain from middleware i on, and the
			// provider after the last; each result handed outward carries
			// its outcome.
			withOutcome := func(res ProviderResult) ProviderResult {
				res.Outcome = ProviderOutcome(op.Outcome(attempt.CallResult{Response: res.Response, Found: res.Found, Err: res.Err}, classifyError))
				return res
			}
			var inner func(i int) func(ctx context.Context) ProviderResult
			inner = func(i int) func(ctx context.Context) ProviderResult {
				if i == len(chain) {
					return provider
				}
				return func(ctx context.Context) ProviderResult {
					return withOutcome(chain[i].AroundProvider(ctx, call, inner(i+1)))
				}
			}
			res = chain[0].AroundProvider(ctx, call, inner(1))
		}
		return attempt.CallResult{Response: res.Response, Found: res.Found, Err: res.Err}
	}
}
