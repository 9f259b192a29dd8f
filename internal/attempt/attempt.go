// Package attempt claims due keys, runs claimed attempts of keys and records
// their outcomes: the machinery that the inline path (outbox's Client.Do),
// the dispatcher, the reconciler and oncetest's Drain share. It cannot import package outbox, so it works on
// its own small types (a [Tool] with its call and lookup functions and
// delivery, a [Request], an error classifier), which outbox adapts from its
// registry; none of it is part of the public API. The dispatcher and the
// reconciler find a client's [Runner] with [Of].
package attempt

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime/debug"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pgonce/pgonce/internal/observe"
	"github.com/pgonce/pgonce/internal/store"
)

// Request is what a provider receives for one attempt.
type Request struct {
	Key       string
	NaturalID string
	Tool      string
	Args      json.RawMessage
	Attempt   int
	// Metadata is the call's stored metadata (a JSON object of strings),
	// nil when it has none.
	Metadata []byte
}

// Tool is a registered tool as the machinery sees it.
type Tool struct {
	Name string
	// Call performs the tool's effect.
	Call func(ctx context.Context, req Request) (json.RawMessage, error)
	// Lookup, nil when the provider cannot look up, answers whether the
	// action happened.
	Lookup   func(ctx context.Context, req Request) (resp json.RawMessage, found bool, err error)
	Delivery store.Delivery
	// KeyRetention is how long the provider remembers a key; zero is
	// forever.
	KeyRetention time.Duration
	// Retention, when positive, replaces [Config.Retention] for the tool's
	// keys.
	Retention time.Duration
	// ReplicatedClaim makes the claims of the tool's keys commit only once
	// the synchronous standbys applied them.
	ReplicatedClaim bool
	// Begin, set for a transactional tool ([store.DeliveryTransactional])
	// instead of Call, opens the transaction that an attempt runs the
	// provider in and records its outcome in.
	Begin func(ctx context.Context) (Tx, error)
	// Wrap, when set, runs every call and lookup of the tool: it calls next
	// to reach the provider, or returns without it to refuse. The runner
	// classifies what it returns as it would the provider's own answer, and
	// a panic in it counts as a provider's.
	Wrap func(ctx context.Context, op *Op, next func(ctx context.Context) CallResult) CallResult
}

// ErrorKind classifies a provider's error.
type ErrorKind int

// Error kinds.
const (
	// Retryable: the call changed nothing and may be tried again.
	Retryable ErrorKind = iota
	// Permanent: a failure to store and replay; never retried.
	Permanent
	// Ambiguous: the effect may or may not have happened.
	Ambiguous
)

// Config is what a [Runner] needs from its client.
type Config struct {
	// CallTimeout is the deadline of one provider call or lookup.
	CallTimeout time.Duration
	// Lease is how long a claim holds its key.
	Lease time.Duration
	// Retention is how long a finished key keeps its response.
	Retention time.Duration
	// TombstoneRetention is how long a finished key is remembered at all.
	TombstoneRetention time.Duration
	// StatementTimeout bounds each statement the runner runs.
	StatementTimeout time.Duration
	// NotifyDisabled leaves the notifications of finished and released
	// keys out.
	NotifyDisabled bool
	// Logger receives the runner's logs, unless the context of a call
	// carries another ([WithLogger]).
	Logger *slog.Logger
	// NowFunc, when set, replaces the database's clock in statements.
	NowFunc func() time.Time
	// ToolFunc returns the registered tool named name, or nil.
	ToolFunc func(name string) *Tool
	// Classify tells a provider's errors apart.
	Classify func(err error) ErrorKind
	// FailureBody is what is stored for a permanent failure (an error
	// Classify reports as [Permanent], or a retryable one at the attempt
	// limit): the provider's own failure bytes when err carries them,
	// verbatim, and err's text as JSON otherwise.
	FailureBody func(err error) json.RawMessage
	// AmbiguousFunc wraps err as an error whose effect is unknown (a
	// panic's), which Classify reports as [Ambiguous].
	AmbiguousFunc func(err error) error
	// Observer, nil when none, is told of the client's batches and
	// maintenance runs; see [Runner.Observer].
	Observer observe.Observer
}

// Runner runs attempts and records outcomes for one client.
type Runner struct {
	config Config
	store  *store.Store
}

// New returns a runner over s.
func New(s *store.Store, config Config) *Runner {
	return &Runner{config: config, store: s}
}

// Store returns the runner's store.
func (r *Runner) Store() *store.Store { return r.store }

// Observer returns the client's observer, nil when it has none: the
// dispatcher and reconciler over the client tell it of their batches and
// runs.
func (r *Runner) Observer() observe.Observer { return r.config.Observer }

// Lease is how long a claim holds its key: the client's lease.
func (r *Runner) Lease() time.Duration { return r.config.Lease }

// StatementTimeout is the client's deadline of each statement.
func (r *Runner) StatementTimeout() time.Duration { return r.config.StatementTimeout }

// Tool returns the registered tool named name, or nil.
func (r *Runner) Tool(name string) *Tool { return r.config.ToolFunc(name) }

// Handle carries a client's runner. Package outbox embeds one in its
// Client, set when the client is made, under an unexported alias so that it
// stays out of the client's documentation; [Of] reaches it through
// [Holder], whose unexported method only such an embedding provides.
type Handle struct{ runner *Runner }

// NewHandle returns a handle on runner.
func NewHandle(runner *Runner) Handle { return Handle{runner: runner} }

func (h Handle) attemptRunner() *Runner { return h.runner }

// Holder is implemented by every *outbox.Client, of any transaction type,
// and by nothing outside this module: its method is unexported, promoted
// from the embedded [Handle].
type Holder interface{ attemptRunner() *Runner }

// ErrNoRunner is returned by [Of] for a client that was not made by
// outbox.New or outbox.NewPgx (a zero Client, say), which has no runner.
var ErrNoRunner = errors.New("the client was not made by outbox.New or outbox.NewPgx")

// Of returns the runner of client, or [ErrNoRunner].
func Of(client Holder) (*Runner, error) {
	if client == nil {
		return nil, ErrNoRunner
	}
	if runner := client.attemptRunner(); runner != nil {
		return runner, nil
	}
	return nil, ErrNoRunner
}

// Attempt is one claimed attempt of a key.
type Attempt struct {
	// Tool is the key's tool.
	Tool *Tool
	// Request is what the provider receives.
	Request Request
	// Scope is the key's scope, in its text form, which the statements
	// that record the outcome find the key's row by.
	Scope string
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

// Claimed returns the attempt of row, a key the store claimed, for the
// registered tool of its name: row's request (metadata included) and
// timings, claimedAt the local clock taken just before the claiming
// statement was sent, maxAttempts (zero: no limit) and the client's lease.
// Every attempt of a claimed row is built here, so that the dispatcher, the
// reconciler and oncetest's Drain hand providers the same request.
func (r *Runner) Claimed(row *store.ClaimedKey, claimedAt time.Time, maxAttempts int) Attempt {
	return Attempt{
		Tool: r.Tool(row.Tool),
		Request: Request{
			Key:       row.Key,
			NaturalID: row.NaturalID,
			Tool:      row.Tool,
			Args:      row.Args,
			Attempt:   row.Attempt,
			Metadata:  row.Metadata,
		},
		Scope:            row.Scope,
		Ambiguous:        row.Ambiguous,
		FirstAttemptedAt: row.FirstAttemptedAt,
		ClaimedNow:       row.Now,
		ClaimedAt:        claimedAt,
		MaxAttempts:      maxAttempts,
		Lease:            r.config.Lease,
	}
}

// Kind classifies how an attempt ended.
type Kind int

// Outcome kinds.
const (
	Succeeded Kind = iota
	Failed
	NeedsReview
	Retry
)

// String names the outcome kind, for logs.
func (k Kind) String() string {
	switch k {
	case Succeeded:
		return "succeeded"
	case Failed:
		return "failed"
	case NeedsReview:
		return "needs_review"
	case Retry:
		return "retry"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// storedState is the stored key state a final outcome leaves.
func (k Kind) storedState() store.State {
	switch k {
	case Succeeded:
		return store.StateSucceeded
	case Failed:
		return store.StateFailed
	case NeedsReview:
		return store.StateNeedsReview
	}
	panic(fmt.Sprintf("outcome kind %d has no final state", int(k)))
}

// Outcome is how an attempt ended, ready to be recorded.
type Outcome struct {
	Key string
	// Scope is the key's scope ([Attempt.Scope]).
	Scope     string
	Tool      string
	Attempt   int
	Kind      Kind
	Response  json.RawMessage
	Failure   json.RawMessage
	Retention time.Duration
	// RetryDelay, Ambiguous and Err describe a Retry.
	RetryDelay time.Duration
	Ambiguous  bool
	Err        error
	// GaveUp reports a final outcome that a retryable or uncertain failure
	// became at the attempt limit ([Attempt.MaxAttempts]).
	GaveUp bool
	// SlowDown, when positive, is how long the provider asked the whole
	// tool to wait (outbox.SlowDown): a Retry outcome then never gave up
	// for the attempt limit, and the dispatcher throttles the tool and
	// returns the key without spending the attempt.
	SlowDown time.Duration
	// TxEnd says what an attempt of a transactional tool left to record.
	TxEnd TxEnd
}

// NewOutcome returns the outcome of a's attempt, of no kind yet
// ([Succeeded]), with its retention.
func (r *Runner) NewOutcome(a Attempt) Outcome {
	return Outcome{
		Key:       a.Request.Key,
		Scope:     a.Scope,
		Tool:      a.Request.Tool,
		Attempt:   a.Request.Attempt,
		Retention: cmp.Or(a.Tool.Retention, r.config.Retention),
	}
}

// Run runs one claimed attempt: a lookup first where an earlier attempt
// left the effect unknown and the tool can look up, then the provider call
// under [Config.CallTimeout]. It never panics: a provider that panics may
// have acted before it did, so a panic is an uncertain outcome and follows
// the tool's [store.Delivery] like any other. backoff gives the delay before
// retry n (from 1); nil means none.
func (r *Runner) Run(ctx context.Context, a Attempt, backoff func(attempt int) time.Duration) Outcome {
	tool := a.Tool
	if tool.Begin != nil {
		// An earlier attempt of a transactional tool committed with its
		// outcome or rolled back: none is uncertain.
		return r.runTx(ctx, a, backoff)
	}
	out := r.NewOutcome(a)

	if a.Ambiguous {
		switch how, resp, err := r.Settle(ctx, a); how {
		case SettleReview:
			out.Err = err
			return out.needsReview()
		case SettleFound:
			return out.succeeded(resp)
		case SettleFailed:
			out.Kind, out.Failure, out.Err = Failed, resp, err
			return out
		case SettleLookupFailed:
			return out.retry(a, backoff, true, err, r.config.FailureBody)
		case SettleNotFound:
			a.Ambiguous = false
		case SettleByKey:
		}
	}

	resp, err := r.call(ctx, tool, &Op{Request: a.Request, Delivery: tool.Delivery, MaxAttempts: a.MaxAttempts}, tool.Call)
	if err == nil {
		return out.succeeded(resp)
	}
	out.SlowDown = slowDownDelay(err)
	switch r.config.Classify(err) {
	case Permanent:
		out.Kind, out.Failure, out.Err, out.SlowDown = Failed, r.config.FailureBody(err), err, 0
		return out
	case Ambiguous:
		if tool.Delivery == store.DeliveryAtMostOnce {
			out.Err = err
			return out.needsReview()
		}
		return out.retry(a, backoff, true, err, r.config.FailureBody)
	default:
		return out.retry(a, backoff, a.Ambiguous, err, r.config.FailureBody)
	}
}

// Settlement is how an attempt after one whose outcome is unknown can
// proceed, by the tool's [store.Delivery].
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
	// SettleFailed: a lookup found that the action failed for good (it
	// returned an error [Config.Classify] reports as [Permanent]); the
	// failure to store comes along.
	SettleFailed
)

// Settle decides, without calling the provider, how attempt a may proceed
// after an attempt whose outcome is unknown: transactional tools call
// again, since an attempt that left its key open rolled back; [AtMostOnce]
// tools go to review; [ByLookup] tools, and [ByKey] ones past their provider's key
// retention that can look up, read before they write; the latter without a
// lookup go to review; the rest retry by key. A lookup runs under
// [Config.CallTimeout] and a panic in it becomes an error. It is shared by
// [Runner.Run] and the reconciler.
//
// The error says why for [SettleReview], [SettleLookupFailed] and
// [SettleFailed]; the bytes are the response found for [SettleFound] and the
// failure to store (see [Config.FailureBody]) for [SettleFailed].
func (r *Runner) Settle(ctx context.Context, a Attempt) (Settlement, json.RawMessage, error) {
	tool := a.Tool
	pastKeyWindow := tool.Delivery == store.DeliveryByKey && tool.KeyRetention > 0 &&
		!a.FirstAttemptedAt.IsZero() && a.sinceFirstAttempt() > tool.KeyRetention
	switch {
	case tool.Delivery == store.DeliveryTransactional:
		// The attempt's effect committed with its outcome, or rolled back
		// with it: a key still open had no effect.
		return SettleNotFound, nil, nil
	case tool.Delivery == store.DeliveryAtMostOnce:
		return SettleReview, nil, errors.New("an earlier attempt's outcome is unknown, and an at-most-once tool is never tried again")
	case tool.Delivery == store.DeliveryByLookup || (pastKeyWindow && tool.Lookup != nil):
		// Read before write: the earlier attempt may have acted.
		resp, found, err := r.lookup(ctx, tool, &Op{Lookup: true, Request: a.Request, Delivery: tool.Delivery, MaxAttempts: a.MaxAttempts})
		switch {
		case err != nil && r.config.Classify(err) == Permanent:
			return SettleFailed, r.config.FailureBody(err), fmt.Errorf("lookup: %w", err)
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
		return SettleReview, nil, fmt.Errorf("an earlier attempt's outcome is unknown, and the provider's key retention of %s has passed", tool.KeyRetention)
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
	o.Kind, o.Response = Succeeded, resp
	return o
}

func (o Outcome) needsReview() Outcome {
	o.Kind = NeedsReview
	return o
}

func (o Outcome) retry(a Attempt, backoff func(int) time.Duration, ambiguous bool, err error, failureBody func(error) json.RawMessage) Outcome {
	o.Err, o.Ambiguous = err, ambiguous
	// A provider's slow down is the tool's pace, not the key's failure: it
	// never uses the key's last attempt up.
	if a.MaxAttempts > 0 && a.Request.Attempt >= a.MaxAttempts && o.SlowDown <= 0 {
		o.GaveUp = true
		if ambiguous && a.Tool.Delivery != store.DeliveryByKey {
			return o.needsReview()
		}
		o.Kind, o.Failure = Failed, failureBody(fmt.Errorf("gave up after %d attempts: %w", a.Request.Attempt, err))
		return o
	}
	o.Kind = Retry
	if backoff != nil {
		o.RetryDelay = backoff(a.Request.Attempt)
	}
	// A provider that was told when to come back (outbox.RetryAfter, say an
	// HTTP Retry-After) is not asked sooner.
	var hinted interface{ RetryDelay() time.Duration }
	if errors.As(err, &hinted) {
		o.RetryDelay = max(o.RetryDelay, hinted.RetryDelay())
	}
	return o
}

// slowDownDelay is the delay of a provider's slow down in err's chain
// (outbox.SlowDownError), or zero.
func slowDownDelay(err error) time.Duration {
	var slow interface{ SlowDownDelay() time.Duration }
	if errors.As(err, &slow) {
		return max(slow.SlowDownDelay(), 0)
	}
	return 0
}

// call runs the provider under the call timeout and turns a panic into an
// ambiguous error, logged with its stack: the provider may have acted before
// it panicked, so a panic is never taken for "nothing happened".
func (r *Runner) call(ctx context.Context, tool *Tool, op *Op, callFunc func(ctx context.Context, req Request) (json.RawMessage, error)) (resp json.RawMessage, err error) {
	req := op.Request
	ctx, cancel := context.WithTimeout(ctx, r.config.CallTimeout)
	defer cancel()
	defer func() {
		if p := recover(); p != nil {
			r.logger(ctx).ErrorContext(ctx, "pgonce: provider panicked",
				"tool", req.Tool, "key", req.Key, "attempt", req.Attempt, "panic", p, "stack", string(debug.Stack()))
			err = r.config.AmbiguousFunc(fmt.Errorf("provider panicked: %v", p))
		}
	}()
	res := wrapped(ctx, tool, op, func(ctx context.Context) CallResult {
		resp, err := callFunc(ctx, req)
		return CallResult{Response: resp, Err: err}
	})
	return res.Response, res.Err
}

func (r *Runner) lookup(ctx context.Context, tool *Tool, op *Op) (resp json.RawMessage, found bool, err error) {
	req := op.Request
	ctx, cancel := context.WithTimeout(ctx, r.config.CallTimeout)
	defer cancel()
	defer func() {
		if p := recover(); p != nil {
			r.logger(ctx).ErrorContext(ctx, "pgonce: lookup panicked",
				"tool", req.Tool, "key", req.Key, "panic", p, "stack", string(debug.Stack()))
			err = fmt.Errorf("lookup panicked: %v", p)
		}
	}()
	if tool.Lookup == nil {
		return nil, false, errors.New("the provider cannot look up")
	}
	res := wrapped(ctx, tool, op, func(ctx context.Context) CallResult {
		resp, found, err := tool.Lookup(ctx, req)
		return CallResult{Response: resp, Found: found, Err: err}
	})
	return res.Response, res.Found, res.Err
}

// errorText is err's text, made safe to store (see [SanitizeText]).
func errorText(err error) string {
	if err == nil {
		return ""
	}
	return SanitizeText(err.Error())
}

// maxErrorTextBytes bounds the error text stored with a key.
const maxErrorTextBytes = 2048

// SanitizeText makes text that came from outside, such as a provider's
// error, safe to store in a text column: PostgreSQL rejects a NUL byte and
// invalid UTF-8 (SQLSTATE 22021), so both become U+FFFD, and text longer
// than 2 KiB is cut on a character boundary and ends in "…".
func SanitizeText(s string) string {
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
