package httpprovider

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"unicode/utf8"
)

// ErrNotEnvelope is returned by [Decode] for bytes that are not a response
// stored by this package.
var ErrNotEnvelope = errors.New("not an httpprovider response envelope")

// Response is a downstream answer as this package stores it: in
// [outbox.Result.Response] for a success, in [outbox.Result.Failure] for a
// permanent failure (through [outbox.PermanentBody]).
//
// The stored bytes are a JSON object, the envelope:
//
//	{"status":201,"headers":{"Request-Id":["req_1"]},"body":{"id":"re_1"}}
//
// status is the HTTP status code; headers holds the kept headers
// ([Config.KeepHeaders]), omitted when none was present; the body is
// stored in exactly one of three members, so that [Decode] gives back its
// bytes exactly:
//
//   - body: the body itself, verbatim, when it is valid JSON in valid
//     UTF-8 with no leading or trailing white space (a model reading the
//     observation sees the provider's JSON as it is);
//   - body_text: a JSON string of the body, for other valid UTF-8 (a JSON
//     body ending in a newline, plain text);
//   - body_base64: the body in standard base64, for the rest, JSON
//     holding invalid UTF-8 included.
//
// So the envelope is always valid JSON in valid UTF-8.
//
// An empty body stores none of them.
type Response struct {
	// Status is the HTTP status code.
	Status int
	// Header holds the kept response headers, canonicalised.
	Header http.Header
	// Body is the response body, byte for byte.
	Body []byte
}

// envelope is the stored JSON shape of a [Response].
type envelope struct {
	Status     int             `json:"status"`
	Headers    http.Header     `json:"headers,omitempty"`
	Body       json.RawMessage `json:"body,omitempty"`
	BodyText   *string         `json:"body_text,omitempty"`
	BodyBase64 []byte          `json:"body_base64,omitempty"`
}

// Encode returns the envelope of r, the bytes this package stores.
func (r *Response) Encode() (json.RawMessage, error) {
	env := envelope{Status: r.Status}
	if len(r.Header) > 0 {
		env.Headers = r.Header
	}
	var raw []byte
	switch {
	case len(r.Body) == 0:
	case utf8.Valid(r.Body) && json.Valid(r.Body) && len(bytes.TrimSpace(r.Body)) == len(r.Body):
		// json.Valid accepts invalid UTF-8 inside strings; stored verbatim,
		// such a body would make the envelope itself invalid JSON text.
		// encoding/json compacts a RawMessage it marshals; the body is put
		// in place by hand below so that its bytes stay as they were.
		raw = r.Body
	case utf8.Valid(r.Body):
		text := string(r.Body)
		env.BodyText = &text
	default:
		env.BodyBase64 = r.Body
	}
	out, err := json.Marshal(env)
	if err != nil {
		return nil, fmt.Errorf("encode response: %w", err)
	}
	if raw == nil {
		return out, nil
	}
	buf := make([]byte, 0, len(out)+len(raw)+8)
	buf = append(buf, out[:len(out)-1]...)
	buf = append(buf, `,"body":`...)
	buf = append(buf, raw...)
	buf = append(buf, '}')
	return buf, nil
}

// Decode returns the response stored in stored, an envelope that this
// package wrote: a [outbox.Result.Response] or [outbox.Result.Failure] of a
// tool it serves. It returns an error matching [ErrNotEnvelope] for
// anything else.
func Decode(stored json.RawMessage) (*Response, error) {
	var env envelope
	dec := json.NewDecoder(bytes.NewReader(stored))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&env); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotEnvelope, err)
	}
	if env.Status < 100 || env.Status > 999 {
		return nil, fmt.Errorf("%w: status %d", ErrNotEnvelope, env.Status)
	}
	resp := &Response{Status: env.Status, Header: env.Headers}
	switch {
	case len(env.Body) > 0:
		resp.Body = bytes.Clone(env.Body)
	case env.BodyText != nil:
		resp.Body = []byte(*env.BodyText)
	default:
		resp.Body = env.BodyBase64
	}
	if resp.Header == nil {
		resp.Header = http.Header{}
	}
	return resp, nil
}
