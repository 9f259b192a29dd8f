package outbox

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"
)

// Result describes a key as one request found or left it.
type Result struct {
	// Key is the action's idempotency key.
	Key Key
	// State is where the key stands.
	State State
	// Created reports whether this request created the key. A succeeded
	// result with Created false is a replay.
	Created bool
	// Tool is the key's tool.
	Tool string
	// Response holds the provider's response, verbatim, when State is
	// [StateSucceeded].
	Response json.RawMessage
	// Failure holds the stored failure, verbatim, when State is
	// [StateFailed].
	Failure json.RawMessage
	// Attempts counts the claims of the key so far: every provider attempt,
	// and every reconciler resolution, which takes the key under a new
	// attempt number to fence out the worker that held it.
	Attempts int
	// CreatedAt is when the key was claimed.
	CreatedAt time.Time
	// UpdatedAt is when the key last changed.
	UpdatedAt time.Time
	// CompletedAt is when the key reached a final state, or zero.
	CompletedAt time.Time
	// RetryAfter suggests, while the key is pending or in flight, when to
	// ask again. Zero otherwise.
	RetryAfter time.Duration
	// LastError says why the last attempt of a finished or needs-review key
	// did not succeed, for operators; empty otherwise. A pending key's last
	// error is in [Inspection.Queue].
	LastError string
}

// Replayed reports whether r returns an outcome stored by an earlier request.
func (r Result) Replayed() bool {
	return !r.Created && (r.State == StateSucceeded || r.State == StateFailed)
}

// Observation is the JSON-ready value an agent runtime puts in a model's
// context for a tool call. Its JSON shape is a stable contract:
//
//	{"status":"succeeded","key":"k1_…","replayed":true,"response":<verbatim>}
//	{"status":"failed","key":"k1_…","failure":<verbatim>}
//	{"status":"in_progress","key":"k1_…","retry_after_ms":250,"message":"…"}
//	{"status":"needs_review","key":"k1_…","message":"…"}
//	{"status":"expired","key":"k1_…","completed_at":"2026-…Z","message":"…"}
//
// replayed appears, as true, only when the outcome was stored by an earlier
// request. response and failure are the stored bytes exactly as the provider
// returned them when those bytes are valid JSON in valid UTF-8. Other bytes
// (not JSON, or JSON holding bytes that are not UTF-8, such as {"s":"\xff"})
// appear as a JSON string of those bytes instead, each invalid byte replaced
// by U+FFFD, so that an Observation is always valid UTF-8 JSON.
// [Result.Response] and [Result.Failure] keep the stored bytes verbatim.
type Observation struct {
	Status       string          `json:"status"`
	Key          Key             `json:"key"`
	Replayed     bool            `json:"replayed,omitempty"`
	Response     json.RawMessage `json:"response,omitempty"`
	Failure      json.RawMessage `json:"failure,omitempty"`
	RetryAfterMS int64           `json:"retry_after_ms,omitempty"`
	CompletedAt  *time.Time      `json:"completed_at,omitempty"`
	Message      string          `json:"message,omitempty"`
}

// Observation returns what a model should see of r.
func (r Result) Observation() Observation {
	obs := Observation{Key: r.Key}
	switch r.State {
	case StateSucceeded:
		obs.Status, obs.Replayed, obs.Response = "succeeded", r.Replayed(), r.Response
	case StateFailed:
		obs.Status, obs.Replayed, obs.Failure = "failed", r.Replayed(), r.Failure
	case StatePending, StateInFlight:
		obs.Status = "in_progress"
		obs.RetryAfterMS = max(r.RetryAfter.Milliseconds(), 1)
		obs.Message = "the action is in progress; ask again later with the same arguments, never with new ones"
	case StateNeedsReview:
		obs.Status = "needs_review"
		obs.Message = "the outcome of this action is unknown and waits for an operator; do not retry it"
	case StateExpired:
		obs.Status = "expired"
		if !r.CompletedAt.IsZero() {
			completed := r.CompletedAt.UTC()
			obs.CompletedAt = &completed
		}
		obs.Message = "this action already ran; its result is no longer kept"
	}
	return obs
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
