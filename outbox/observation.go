package outbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/pgonce/pgonce/internal/store"
)

// ObservationStatus says which outcome an [Observation] reports. Its values
// are a stable contract: a runtime or a gateway may switch on them.
type ObservationStatus string

// The statuses of an [Observation]. The first five report a key's state;
// the others report why a call has no state to report.
const (
	// ObservationSucceeded: the action ran and its response is stored.
	ObservationSucceeded ObservationStatus = "succeeded"
	// ObservationFailed: the action ran and failed permanently; its failure
	// is stored.
	ObservationFailed ObservationStatus = "failed"
	// ObservationInProgress: the key is pending or in flight.
	ObservationInProgress ObservationStatus = "in_progress"
	// ObservationNeedsReview: nobody could determine the outcome; an
	// operator decides.
	ObservationNeedsReview ObservationStatus = "needs_review"
	// ObservationExpired: the action ran, and its outcome is no longer kept.
	ObservationExpired ObservationStatus = "expired"
	// ObservationConflict: another action holds the step or the business
	// key ([ErrKeyConflict]); nothing ran.
	ObservationConflict ObservationStatus = "conflict"
	// ObservationInvalidArguments: the arguments have no canonical form
	// ([ErrNotCanonical]); nothing ran.
	ObservationInvalidArguments ObservationStatus = "invalid_arguments"
	// ObservationUnknownTool: the tool is not registered ([ErrUnknownTool])
	// or its name is malformed; nothing ran.
	ObservationUnknownTool ObservationStatus = "unknown_tool"
	// ObservationInvalidCall: a field of the call other than its tool and
	// arguments breaks a rule ([ErrInvalidCall], or [ErrInvalidKey] for a
	// malformed key): the caller's fault, not the model's; nothing ran.
	ObservationInvalidCall ObservationStatus = "invalid_call"
	// ObservationNotFound: no action was ever asked for under the key
	// ([ErrNotFound]).
	ObservationNotFound ObservationStatus = "not_found"
	// ObservationUnavailable: the store could not be read or written just
	// now (a lost connection, a timeout, a serialization failure, a done
	// context); asking again with the same arguments is safe.
	ObservationUnavailable ObservationStatus = "unavailable"
	// ObservationError: any other error, such as a schema that is not
	// migrated. Its text is not shown to the model.
	ObservationError ObservationStatus = "error"
	// ObservationCancelled: an operator cancelled the key while it was
	// pending ([Client.Cancel]); the action did not run.
	ObservationCancelled ObservationStatus = "cancelled"
)

// ObservationUnavailableRetryAfter is the retry_after_ms that an
// [ObservationUnavailable] suggests.
const ObservationUnavailableRetryAfter = time.Second

// The messages of the statuses that carry one. They tell a model what it
// may do next, and never change for a given status.
const (
	messageInProgress       = "the action is in progress; ask again later with the same arguments, never with new ones"
	messageNeedsReview      = "the outcome of this action is unknown and waits for an operator; do not retry it"
	messageExpired          = "this action already ran; its result is no longer kept"
	messageConflict         = "another action already holds this step or key, so nothing ran; to get that action's result ask again with its original tool and arguments, and ask for a different action under a new step"
	messageInvalidArguments = "the arguments cannot be used as they are (see path and reason), so nothing ran; correct them and ask again"
	messageUnknownTool      = "no tool of this name is available, so nothing ran; use one of the tools you were given"
	messageInvalidCall      = "the service could not make this call (see field and reason); the arguments are not at fault and nothing ran; do not ask again until the service is fixed"
	messageNotFound         = "no action was ever asked for under this key, so nothing ran; ask for the action itself if it is still wanted"
	messageUnavailable      = "the action could not be checked or recorded just now; ask again with the same arguments after retry_after_ms: it never runs twice"
	messageError            = "the service failed while handling this action; asking again with the same arguments never runs it twice, but may fail the same way"
	messageCancelled        = "an operator cancelled this action, so it did not run and will not run; do not ask for it again"
)

// Observation is the JSON-ready value an agent runtime puts in a model's
// context for a tool call: one shape for every outcome and every error, with
// a message a model can act on. Its JSON shape is a stable contract; each
// status always carries the members shown:
//
//	{"status":"succeeded","key":"k1_…","replayed":true,"response":<verbatim>}
//	{"status":"failed","key":"k1_…","replayed":true,"failure":<verbatim>}
//	{"status":"in_progress","key":"k1_…","retry_after_ms":250,"message":"…"}
//	{"status":"needs_review","key":"k1_…","message":"…"}
//	{"status":"expired","key":"k1_…","completed_at":"2026-…Z","message":"…"}
//	{"status":"cancelled","key":"k1_…","message":"…"}
//	{"status":"conflict","key":"k1_…","existing_key":"k1_…","existing_tool":"refund","message":"…"}
//	{"status":"invalid_arguments","path":"$.amount","reason":"…","message":"…"}
//	{"status":"unknown_tool","message":"…"}
//	{"status":"invalid_call","field":"RunID","reason":"…","message":"…"}
//	{"status":"not_found","message":"…"}
//	{"status":"unavailable","retry_after_ms":1000,"message":"…"}
//	{"status":"error","message":"…"}
//
// replayed appears, as true, only when the outcome belongs to an earlier
// request (see [Result.Replayed]). completed_at appears when the completion
// time is known. response and failure are the stored bytes exactly as the
// provider returned them when those bytes are valid JSON in valid UTF-8.
// Other bytes (not JSON, or JSON holding bytes that are not UTF-8, such as
// {"s":"\xff"}) appear as a JSON string of those bytes instead, each
// invalid byte replaced by U+FFFD, so that an Observation is always valid
// UTF-8 JSON. [Result.Response] and [Result.Failure] keep the stored bytes
// verbatim.
type Observation struct {
	// Status says which outcome this is.
	Status ObservationStatus `json:"status"`
	// Key is the action's key, when the outcome concerns one.
	Key Key `json:"key,omitempty"`
	// Replayed reports an outcome that belongs to an earlier request.
	Replayed bool `json:"replayed,omitempty"`
	// ExistingKey and ExistingTool name, for a conflict, the action that
	// holds the step or the business key.
	ExistingKey  Key    `json:"existing_key,omitempty"`
	ExistingTool string `json:"existing_tool,omitempty"`
	// Field names, for an invalid call, the offending [Call] field.
	Field string `json:"field,omitempty"`
	// Path locates, for invalid arguments, the offending value.
	Path string `json:"path,omitempty"`
	// Reason states, for invalid arguments or an invalid call, the rule
	// broken.
	Reason string `json:"reason,omitempty"`
	// Response is the stored response of a succeeded key.
	Response json.RawMessage `json:"response,omitempty"`
	// Failure is the stored failure of a failed key.
	Failure json.RawMessage `json:"failure,omitempty"`
	// RetryAfterMS suggests, in milliseconds, when to ask again.
	RetryAfterMS int64 `json:"retry_after_ms,omitempty"`
	// CompletedAt is when an expired key's action completed, in UTC.
	CompletedAt *time.Time `json:"completed_at,omitempty"`
	// Message tells the model what it may do next.
	Message string `json:"message,omitempty"`
}

// ObservationFor returns what a model should see of a call that returned
// res and err: pass it whatever [Client.SubmitTx], [Client.Submit],
// [Client.Do], [Client.Get], [Client.Wait] or [Client.WaitResult]
// returned, error included. With a nil error it reports res's state. An
// error reports its own status ([ObservationConflict],
// [ObservationInvalidArguments], …), except that a key res shows in
// progress is reported in progress whatever the error ([ErrInProgress],
// [ErrProviderFailed], a Wait whose ctx ended, a Do whose record failed),
// since the key's state is what the model must know. Errors it does not
// know become [ObservationError], without their text, which may name
// internals a model must not see.
func ObservationFor(res Result, err error) Observation {
	if err == nil {
		return stateObservation(res)
	}
	var (
		conflict     *KeyConflictError
		notCanonical *NotCanonicalError
		invalidCall  *InvalidCallError
		expired      *ExpiredError
		inProgress   *InProgressError
	)
	switch {
	case errors.As(err, &conflict):
		return Observation{
			Status: ObservationConflict, Key: conflict.Key,
			ExistingKey: conflict.ExistingKey, ExistingTool: conflict.ExistingTool,
			Message: messageConflict,
		}
	case errors.Is(err, ErrKeyConflict):
		return Observation{Status: ObservationConflict, Key: res.Key, Message: messageConflict}
	case errors.As(err, &notCanonical):
		return Observation{
			Status: ObservationInvalidArguments, Path: notCanonical.Path, Reason: notCanonical.Reason,
			Message: messageInvalidArguments,
		}
	case errors.Is(err, ErrNotCanonical):
		return Observation{Status: ObservationInvalidArguments, Message: messageInvalidArguments}
	case errors.Is(err, ErrUnknownTool):
		return Observation{Status: ObservationUnknownTool, Message: messageUnknownTool}
	case errors.As(err, &invalidCall) && invalidCall.Field == "Tool":
		// A malformed tool name names no tool that could be registered.
		return Observation{Status: ObservationUnknownTool, Message: messageUnknownTool}
	case errors.As(err, &invalidCall):
		return Observation{
			Status: ObservationInvalidCall, Field: invalidCall.Field, Reason: invalidCall.Reason,
			Message: messageInvalidCall,
		}
	case errors.Is(err, ErrInvalidCall):
		return Observation{Status: ObservationInvalidCall, Message: messageInvalidCall}
	case errors.Is(err, ErrInvalidKey):
		return Observation{
			Status: ObservationInvalidCall, Field: "key", Reason: "is not a well-formed key",
			Message: messageInvalidCall,
		}
	case errors.As(err, &expired):
		obs := Observation{Status: ObservationExpired, Key: expired.Key, Message: messageExpired}
		obs.CompletedAt = utcOrNil(expired.CompletedAt)
		return obs
	case errors.Is(err, ErrExpired):
		res.State = StateExpired
		return stateObservation(res)
	case res.State.InProgress():
		return stateObservation(res)
	case errors.As(err, &inProgress):
		return Observation{
			Status: ObservationInProgress, Key: inProgress.Key,
			RetryAfterMS: max(inProgress.RetryAfter.Milliseconds(), 1), Message: messageInProgress,
		}
	case errors.Is(err, ErrNotFound):
		return Observation{Status: ObservationNotFound, Message: messageNotFound}
	case unavailable(err):
		return Observation{
			Status:       ObservationUnavailable,
			RetryAfterMS: ObservationUnavailableRetryAfter.Milliseconds(),
			Message:      messageUnavailable,
		}
	}
	return Observation{Status: ObservationError, Message: messageError}
}

// stateObservation reports res's state. A state it does not know is
// reported under its own name.
func stateObservation(res Result) Observation {
	obs := Observation{Key: res.Key}
	switch res.State {
	case StateSucceeded:
		obs.Status, obs.Replayed, obs.Response = ObservationSucceeded, res.Replayed(), res.Response
	case StateFailed:
		obs.Status, obs.Replayed, obs.Failure = ObservationFailed, res.Replayed(), res.Failure
	case StatePending, StateInFlight:
		obs.Status = ObservationInProgress
		obs.RetryAfterMS = max(res.RetryAfter.Milliseconds(), 1)
		obs.Message = messageInProgress
	case StateNeedsReview:
		obs.Status, obs.Message = ObservationNeedsReview, messageNeedsReview
	case StateExpired:
		obs.Status, obs.Message = ObservationExpired, messageExpired
		obs.CompletedAt = utcOrNil(res.CompletedAt)
	case StateCancelled:
		obs.Status, obs.Message = ObservationCancelled, messageCancelled
	default:
		obs.Status = ObservationStatus(res.State)
	}
	return obs
}

// unavailable reports whether err says the store could not answer just
// now, so that the same call may well succeed a moment later.
func unavailable(err error) bool {
	return store.IsTransient(err) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, ErrTxAborted) || errors.Is(err, ErrSerialization) || errors.Is(err, ErrTimeout)
}

func utcOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	utc := t.UTC()
	return &utc
}

// JSON returns o as JSON text with Response and Failure embedded verbatim,
// byte for byte as the provider returned them, when they are valid JSON in
// valid UTF-8; otherwise each is embedded as a JSON string, as [Observation]
// describes. The result is always valid UTF-8 JSON. json.Marshal of an
// Observation yields the same document, but encoding/json compacts embedded
// JSON and escapes HTML characters in it; use JSON where the exact bytes
// matter.
func (o Observation) JSON() []byte {
	type plain Observation
	head := plain(o)
	head.Response, head.Failure = nil, nil
	body, err := json.Marshal(head)
	if err != nil {
		// Every field of plain marshals; this cannot happen.
		panic(fmt.Sprintf("marshal observation: %v", err))
	}
	var buf bytes.Buffer
	buf.Write(body[:len(body)-1])
	writeRaw := func(name string, raw json.RawMessage) {
		if raw == nil {
			return
		}
		buf.WriteString(`,"` + name + `":`)
		if len(raw) == 0 {
			buf.WriteString("null")
			return
		}
		// json.Valid accepts bytes that are not UTF-8 inside strings; a
		// model's context must not receive them. encoding/json replaces
		// each invalid byte of a Go string with U+FFFD.
		if !json.Valid(raw) || !utf8.Valid(raw) {
			quoted, _ := json.Marshal(string(raw))
			buf.Write(quoted)
			return
		}
		buf.Write(raw)
	}
	writeRaw("response", o.Response)
	writeRaw("failure", o.Failure)
	buf.WriteByte('}')
	return buf.Bytes()
}

// MarshalJSON implements json.Marshaler with the document of
// [Observation.JSON].
func (o Observation) MarshalJSON() ([]byte, error) {
	return o.JSON(), nil
}
