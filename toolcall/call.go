package toolcall

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/pgonce/pgonce/outbox"
)

// MetadataToolCallID names the [outbox.Call.Metadata] entry that holds the id
// the model gave a call, for operators ([outbox.Client.Inspect]). It is never
// part of the key.
const MetadataToolCallID = "tool_call_id"

// toolCallIDMaxBytes bounds the model's call id kept as metadata: longer ids
// are not kept, rather than refused, since the id is not the action.
const toolCallIDMaxBytes = 256

// Turn locates one model message of tool calls in its run: the run, and the
// step of the message's first call. A runtime recomputes it after a crash
// from its persisted conversation (the adapters count an SDK's message
// history for it), never from the model's text.
type Turn struct {
	// Tenant is the tenant of the run's calls ([outbox.Call.Tenant]); empty
	// for none.
	Tenant string

	// RunID names the run: the conversation, session or task the runtime
	// persists. Required: a call without one is an invalid_call.
	RunID string

	// FirstStep is the step of the message's first tool call: the number of
	// tool calls the run's earlier messages asked for. Zero for the run's
	// first message of tool calls.
	FirstStep int64
}

// Call returns the index-th tool call (from 0, in the message's order) of
// the turn's message: step FirstStep + index, the tool the model called, its
// argument text as written and the id the model gave it.
func (t Turn) Call(index int, id, tool, arguments string) Call {
	return Call{
		ID:        id,
		Tenant:    t.Tenant,
		RunID:     t.RunID,
		Step:      t.FirstStep + int64(index),
		Tool:      tool,
		Arguments: arguments,
	}
}

// Next returns the turn of the run's next message of tool calls, after t's
// message asked for n calls: for a runtime that keeps the count itself
// rather than recounting its history.
func (t Turn) Next(n int) Turn {
	t.FirstStep += int64(n)
	return t
}

// Call is one tool call of a model, as pgonce runs it: where it stands in its
// run, the tool it names and the arguments as the model wrote them. Make one
// with [Turn.Call].
type Call struct {
	// ID is the id the model gave the call (call_…, toolu_…). It is echoed
	// in the tool result and kept as metadata ([MetadataToolCallID]); it is
	// never part of the key.
	ID string

	// Tenant, RunID and Step locate the call in its run (see [Turn]).
	Tenant string
	RunID  string
	Step   int64

	// Tool is the name the model called; [Config.ToolNameFunc] maps it to
	// the registered tool.
	Tool string

	// Arguments is the argument text as the model wrote it, a JSON object.
	// Empty (or only whitespace) means no arguments, {}.
	Arguments string
}

// Arguments returns the canonical form (RFC 8785, see [outbox.Canonicalize])
// of a model's argument text: the bytes a key is derived from and a provider
// receives. Text that is empty or only JSON whitespace is the empty object.
//
// It returns an error matching [ErrInvalidArguments], and wrapping the
// [*outbox.NotCanonicalError] that says where and why, for text that is not
// JSON, has no canonical form (duplicate member names, invalid UTF-8, …) or
// is not a JSON object. Such a call must not run: pass the error to
// [outbox.ObservationFor] (an [Executor] does) and the model reads an
// invalid_arguments observation with the path and the reason.
func Arguments(text string) (json.RawMessage, error) {
	if strings.Trim(text, " \t\r\n") == "" {
		return json.RawMessage("{}"), nil
	}
	canonical, err := outbox.Canonicalize(json.RawMessage(text))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidArguments, err)
	}
	if canonical[0] != '{' {
		return nil, fmt.Errorf("%w: %w", ErrInvalidArguments,
			&outbox.NotCanonicalError{Path: "$", Reason: "tool arguments must be a JSON object"})
	}
	return canonical, nil
}

// metadata returns the metadata a call's key is stored with: the model's id
// for the call, when it can be stored as it is.
func metadata(id string) map[string]string {
	if id == "" || len(id) > toolCallIDMaxBytes || !utf8.ValidString(id) || strings.ContainsRune(id, 0) {
		return nil
	}
	return map[string]string{MetadataToolCallID: id}
}
