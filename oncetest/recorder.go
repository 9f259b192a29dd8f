package oncetest

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/pgonce/pgonce/outbox"
)

// RecorderResponseDefault is what a [Recorder] without a RespondFunc
// answers to every call.
const RecorderResponseDefault = `{"ok":true}`

// Recorder is an [outbox.Provider] that records every request it receives,
// for [RequireCalledOnce] and [RequireNotCalled], and answers through
// RespondFunc. Register one recorder per tool, or one for several: each
// request names its tool. Its zero value is ready to use and safe for
// concurrent use. It has no Lookup: for a [outbox.LookupByNaturalID] tool,
// register a type that embeds it and adds one.
type Recorder struct {
	// RespondFunc answers each call, as a provider would: return
	// [outbox.Permanent] or [outbox.Ambiguous] to test those paths. nil
	// answers [RecorderResponseDefault].
	RespondFunc func(ctx context.Context, req outbox.Request) (json.RawMessage, error)

	mu    sync.Mutex
	calls []outbox.Request
}

// Call records req and answers through RespondFunc. A call is recorded
// before RespondFunc runs, whatever it returns: it is a call the provider
// received.
func (r *Recorder) Call(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
	req.Args = bytes.Clone(req.Args)
	r.mu.Lock()
	r.calls = append(r.calls, req)
	r.mu.Unlock()
	if r.RespondFunc == nil {
		return json.RawMessage(RecorderResponseDefault), nil
	}
	return r.RespondFunc(ctx, req)
}

// Calls returns the requests received so far, in order, tool given or not.
func (r *Recorder) Calls() []outbox.Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

// CallsOf returns the requests received so far for tool, in order.
func (r *Recorder) CallsOf(tool string) []outbox.Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	var calls []outbox.Request
	for _, req := range r.calls {
		if req.Tool == tool {
			calls = append(calls, req)
		}
	}
	return calls
}

// Reset forgets the requests received so far.
func (r *Recorder) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = nil
}

// RequireCalledOnce fails tb unless r received exactly one request for tool
// with arguments args (any value [outbox.Canonicalize] accepts, a
// json.RawMessage included), and returns that request. Arguments are
// compared in their canonical form, so {"b":1,"a":2.0} equals
// map[string]any{"a": 2, "b": 1}. Two calls of the same arguments, a
// retried attempt among them, fail it: the provider was called twice.
func RequireCalledOnce(tb testing.TB, r *Recorder, tool string, args any) outbox.Request {
	tb.Helper()
	want, err := outbox.Canonicalize(args)
	if err != nil {
		tb.Fatalf("oncetest: RequireCalledOnce(%q): expected arguments: %v", tool, err)
		return outbox.Request{}
	}
	var matching []outbox.Request
	calls := r.CallsOf(tool)
	for _, req := range calls {
		got, err := outbox.Canonicalize(req.Args)
		if err == nil && bytes.Equal(got, want) {
			matching = append(matching, req)
		}
	}
	if len(matching) != 1 {
		tb.Fatalf("oncetest: %s called %d times with %s, want once; calls of %s: %s",
			tool, len(matching), want, tool, describe(calls))
		return outbox.Request{}
	}
	return matching[0]
}

// RequireNotCalled fails tb if r received any request for tool.
func RequireNotCalled(tb testing.TB, r *Recorder, tool string) {
	tb.Helper()
	if calls := r.CallsOf(tool); len(calls) > 0 {
		tb.Fatalf("oncetest: %s called %d times, want never: %s", tool, len(calls), describe(calls))
	}
}

// describe lists requests for a failure message.
func describe(calls []outbox.Request) string {
	if len(calls) == 0 {
		return "none"
	}
	parts := make([]string, len(calls))
	for i, req := range calls {
		parts[i] = "key " + string(req.Key) + " attempt " + strconv.Itoa(req.Attempt) + " args " + string(req.Args)
	}
	return strings.Join(parts, "; ")
}
