package outbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/pgonce/pgonce/internal/attempt"
	"github.com/pgonce/pgonce/internal/store"
)

// Provider performs a tool's side effect. It is called at most once per
// attempt, after the attempt's claim is committed, under a deadline shorter
// than the claim's lease.
//
// A provider that honours idempotency keys passes [Request.Key] downstream
// (for example as an Idempotency-Key header). The returned bytes are stored
// verbatim and replayed to every duplicate. Return [Permanent] for a failure
// that must not be retried ([PermanentBody] to store the provider's own
// failure bytes, replayed verbatim like a response), [Ambiguous] when the
// effect may or may not have happened, and any other error for a failure
// known to have changed nothing.
type Provider interface {
	Call(ctx context.Context, req Request) (json.RawMessage, error)
}

// ProviderFunc adapts a function to [Provider].
type ProviderFunc func(ctx context.Context, req Request) (json.RawMessage, error)

// Call calls f.
func (f ProviderFunc) Call(ctx context.Context, req Request) (json.RawMessage, error) {
	return f(ctx, req)
}

// Lookuper is implemented by providers that can answer "did the action with
// this natural id happen?" It is required for [LookupByNaturalID] tools: after
// an ambiguous attempt, Lookup runs before any new call (read before write).
//
// Found, its response is stored as the key's, verbatim. An error wrapped
// with [Permanent] or [PermanentBody] says the action was found to have
// failed for good: the key fails with that failure, stored and replayed as a
// provider's. Any other error leaves the outcome unknown, and the lookup is
// tried again on the next attempt.
type Lookuper interface {
	Lookup(ctx context.Context, req Request) (resp json.RawMessage, found bool, err error)
}

// Request is what a provider receives for one attempt.
type Request struct {
	// Key is the action's idempotency key; pass it downstream.
	Key Key
	// NaturalID is the caller's deterministic id for the action, if any.
	NaturalID string
	// Tool is the registered tool name.
	Tool string
	// Args are the RFC 8785 canonical bytes of the call's arguments.
	Args json.RawMessage
	// Attempt counts from 1.
	Attempt int
	// Metadata is the call's [Call.Metadata] as stored by the submit that
	// created the key; nil when it had none. It is not part of the key.
	Metadata map[string]string
}

// Delivery says how a tool's outcome is made certain after an attempt whose
// outcome is unknown (a crash, or a timeout after the request was sent). Its
// String method returns the delivery's name: "idempotent_by_key",
// "lookup_by_natural_id", "at_most_once" or "transactional".
type Delivery = store.Delivery

const (
	// IdempotentByKey tools deduplicate on the key passed downstream: an
	// uncertain attempt is simply tried again with the same key, within the
	// provider's key-retention window ([ToolOpts.KeyRetention]).
	IdempotentByKey Delivery = store.DeliveryByKey
	// LookupByNaturalID tools can be asked whether the action happened: an
	// uncertain attempt is followed by a lookup, and a call only when the
	// lookup finds nothing. The provider must implement [Lookuper].
	LookupByNaturalID Delivery = store.DeliveryByLookup
	// AtMostOnce tools can do neither: an uncertain attempt sends the key to
	// [StateNeedsReview], and nothing runs until an operator resolves it.
	AtMostOnce Delivery = store.DeliveryAtMostOnce
	// Transactional tools make their effect in the key's own database, in
	// the transaction that records their outcome (see [TxProvider] and
	// [RegisterTx]): effect and outcome commit together, or neither does.
	// No attempt is ever uncertain, so an interrupted one (a crash, a lost
	// lease, a killed connection) is simply tried again, and its key never
	// goes to review for want of an outcome.
	Transactional Delivery = store.DeliveryTransactional
)

// ToolOpts are optional settings of one tool.
type ToolOpts struct {
	// KeyRetention is how long the provider itself remembers an idempotency
	// key (Stripe: 24 hours). Past it, retrying by key is no longer safe: an
	// uncertain attempt is then looked up when the provider is a [Lookuper],
	// and sent to review otherwise. Zero means the provider never forgets.
	KeyRetention time.Duration
	// Retention is how long a finished key of this tool, with its response,
	// is kept. Zero means [Config.Retention].
	Retention time.Duration
	// Middleware runs around every call and lookup of this tool, inside the
	// client's [Config.Middleware], the first outermost. Defaults to none.
	Middleware []Middleware
	// InlineOnly marks a tool whose calls only its callers run, through
	// [Client.Do] with the provider they pass (an HTTP handler, say, that
	// only the next request of its key can run again). Dispatchers never
	// claim its keys and do not report its pending keys as unserved. The
	// reconciler still resolves its expired leases by its delivery: an
	// [IdempotentByKey] key goes back to pending, and the next Do of the
	// same call claims it at once and runs its provider again. A key
	// submitted pending waits for that Do. Defaults to false: dispatchers
	// run the tool's registered provider.
	InlineOnly bool
	// ReplicatedClaim makes every claim of this tool's keys, by a
	// dispatcher or by [Client.Do], commit only once the synchronous
	// standbys applied it (synchronous_commit = remote_apply for the
	// claiming statement alone), before the provider is called. Behind an
	// asynchronous default (synchronous_commit = local) it keeps a failover
	// from forgetting a claim whose provider acted: the promoted standby
	// holds the key in flight, and the reconciler settles it by the tool's
	// delivery (an [AtMostOnce] key goes to review, a [LookupByNaturalID]
	// key is looked up) instead of calling the provider a second time. It
	// takes effect only where synchronous_standby_names names the standby
	// that would be promoted: with none, a commit waits for no standby, and
	// the setting changes nothing. Each claim then waits a round trip to
	// that standby; while it is gone, claims of the tool wait (under
	// [Config.StatementTimeout], after which the dispatcher claims again).
	// A batch of a dispatcher's claim holding such a key waits whole. See
	// docs/high-availability.md. Defaults to false: a claim commits as the
	// server's synchronous_commit says.
	ReplicatedClaim bool
}

// Tool is a registered tool.
type Tool struct {
	// Name is the tool's name as used in [Call.Tool].
	Name string
	// Provider performs the tool's effect.
	Provider Provider
	// Delivery says how an uncertain attempt is resolved.
	Delivery Delivery
	// Opts are the tool's settings; never nil.
	Opts *ToolOpts
}

// Registry maps tool names to providers. It is safe for concurrent use, and
// tools may be registered after a client was created with it.
type Registry struct {
	mu    sync.RWMutex
	tools map[string]*Tool
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{tools: make(map[string]*Tool)}
}

// Register adds tool with its provider and delivery mode. See
// [Registry.RegisterWithOpts].
func (r *Registry) Register(tool string, p Provider, d Delivery) error {
	return r.RegisterWithOpts(tool, p, d, nil)
}

// RegisterWithOpts adds tool with its provider, delivery mode and settings.
// It returns an error matching [ErrInvalidRegistration], and registers
// nothing, for an invalid tool name, a nil provider, an unknown delivery, a
// [LookupByNaturalID] provider that does not implement [Lookuper], a
// [Transactional] provider that is not a [TxProviderFunc] (see
// [RegisterTx] for any other [TxProvider]) or such a provider under
// another delivery, negative durations, or a name already registered.
func (r *Registry) RegisterWithOpts(tool string, p Provider, d Delivery, opts *ToolOpts) error {
	if opts == nil {
		opts = &ToolOpts{}
	}
	switch {
	case !validToolName(tool):
		return fmt.Errorf("%w: tool name %q must match %s", ErrInvalidRegistration, tool, toolNamePattern)
	case p == nil:
		return fmt.Errorf("%w: tool %q: provider must not be nil", ErrInvalidRegistration, tool)
	case d < IdempotentByKey || d > Transactional:
		return fmt.Errorf("%w: tool %q: unknown delivery %d", ErrInvalidRegistration, tool, int(d))
	case opts.KeyRetention < 0 || opts.Retention < 0:
		return fmt.Errorf("%w: tool %q: retentions must not be negative", ErrInvalidRegistration, tool)
	}
	if _, ok := p.(Lookuper); d == LookupByNaturalID && !ok {
		return fmt.Errorf("%w: tool %q: a LookupByNaturalID provider must implement outbox.Lookuper", ErrInvalidRegistration, tool)
	}
	if _, ok := p.(txTyped); ok != (d == Transactional) {
		return fmt.Errorf("%w: tool %q: a Transactional tool's provider, and only its, is an outbox.TxProviderFunc or is registered with outbox.RegisterTx", ErrInvalidRegistration, tool)
	}
	optsCopy := *opts
	optsCopy.Middleware = slices.Clone(opts.Middleware)
	if slices.Contains(optsCopy.Middleware, nil) {
		return fmt.Errorf("%w: tool %q: middleware must not be nil", ErrInvalidRegistration, tool)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.tools == nil {
		r.tools = make(map[string]*Tool)
	}
	if _, ok := r.tools[tool]; ok {
		return fmt.Errorf("%w: tool %q is already registered", ErrInvalidRegistration, tool)
	}
	r.tools[tool] = &Tool{Name: tool, Provider: p, Delivery: d, Opts: &optsCopy}
	return nil
}

// Lookup returns the registered tool named name, or nil.
func (r *Registry) Lookup(name string) *Tool {
	if r == nil {
		return nil
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.tools[name]
}

// Names returns the names of the registered tools, in no particular order.
func (r *Registry) Names() []string {
	if r == nil {
		return nil
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	names := make([]string, 0, len(r.tools))
	for name := range r.tools {
		names = append(names, name)
	}
	return names
}

// Dispatched returns the names of the registered tools that dispatchers
// claim: all but the [ToolOpts.InlineOnly] ones, whose keys only their
// callers' [Client.Do] runs. In no particular order.
func (r *Registry) Dispatched() []string {
	if r == nil {
		return nil
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	names := make([]string, 0, len(r.tools))
	for name, tool := range r.tools {
		if !tool.Opts.InlineOnly {
			names = append(names, name)
		}
	}
	return names
}

// PermanentError marks a provider failure that must not be retried. It is
// stored as the key's failure and replayed to every duplicate. [Permanent]
// and [PermanentBody] make one; a PermanentError built directly stores its
// error as [Permanent] does.
type PermanentError struct {
	// Err is the failure's cause, for logs and the key's last error. It may
	// be nil for one made by [PermanentBody].
	Err error

	// body, when not empty, is stored as the failure verbatim.
	body json.RawMessage
}

// Permanent wraps err as a failure that must not be retried. The failure
// stored and replayed is err's text as a JSON object,
// {"error":"<err's text>"}: valid UTF-8 (each invalid byte and NUL becomes
// U+FFFD), at most 2 KiB of text. It returns nil for a nil err. To store the
// provider's own failure bytes, use [PermanentBody].
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// PermanentBody returns a failure that must not be retried whose stored
// failure is body, byte for byte: the provider's own failure response (say
// {"code":"card_declined"}), replayed verbatim in [Result.Failure] to every
// duplicate, as a success response is. err is the cause, kept for logs and
// as the key's last error; it may be nil, and the last error then shows the
// body.
//
// body is copied: the caller may reuse its buffer. It is stored whatever it
// holds, as responses are; bytes that are not valid JSON in valid UTF-8 are
// kept verbatim in [Result.Failure] and appear in the [Observation] as a
// JSON string. An empty body stores err as [Permanent] does. PermanentBody
// never returns nil, so a provider that returns it always fails.
//
// A [Lookuper] may return it too, for an action it finds that failed for
// good.
func PermanentBody(body json.RawMessage, err error) error {
	return &PermanentError{Err: err, body: bytes.Clone(body)}
}

// Body returns the failure bytes given to [PermanentBody], or nil when the
// failure stored is the error's text.
func (e *PermanentError) Body() json.RawMessage {
	if len(e.body) == 0 {
		return nil
	}
	return bytes.Clone(e.body)
}

// Error returns the wrapped error's text, or the failure body's when there
// is no error.
func (e *PermanentError) Error() string {
	switch {
	case e.Err != nil:
		return "permanent: " + e.Err.Error()
	case len(e.body) > 0:
		return "permanent: failure body " + attempt.SanitizeText(string(e.body))
	}
	return "permanent failure"
}

// Unwrap returns the wrapped error.
func (e *PermanentError) Unwrap() error { return e.Err }

// AmbiguousError marks a provider failure after which the effect may or may
// not have happened, such as a timeout after the request was sent.
type AmbiguousError struct {
	Err error
}

// Ambiguous wraps err as a failure whose effect is unknown. Context deadline
// and cancellation errors from a provider are treated as ambiguous without
// it.
func Ambiguous(err error) error {
	if err == nil {
		return nil
	}
	return &AmbiguousError{Err: err}
}

// Error returns the wrapped error's text.
func (e *AmbiguousError) Error() string { return "ambiguous: " + e.Err.Error() }

// Unwrap returns the wrapped error.
func (e *AmbiguousError) Unwrap() error { return e.Err }

// IsAmbiguous reports whether err leaves a provider's effect unknown: an
// [AmbiguousError], or a context deadline or cancellation.
func IsAmbiguous(err error) bool {
	var ambiguous *AmbiguousError
	return errors.As(err, &ambiguous) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// failureBody is what is stored for a permanent failure: the body of a
// [PermanentBody], verbatim; otherwise the error's text as JSON, valid UTF-8,
// with no NUL escaped into it, of bounded size (see [attempt.SanitizeText]).
func failureBody(err error) json.RawMessage {
	var permanent *PermanentError
	if errors.As(err, &permanent) {
		if len(permanent.body) > 0 {
			return permanent.body
		}
		if permanent.Err != nil {
			err = permanent.Err
		}
	}
	body, _ := json.Marshal(struct {
		Error string `json:"error"`
	}{Error: attempt.SanitizeText(err.Error())})
	return body
}
