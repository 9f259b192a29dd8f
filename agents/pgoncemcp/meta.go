package pgoncemcp

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/toolcall"
)

// The names in a request's or a result's _meta that pgonce reads and writes.
// They follow the protocol's rule for _meta names: a prefix of reverse-DNS
// labels, then a slash.
const (
	// MetaKey names the action of a tools/call request by an idempotency
	// key: a string of at most [outbox.CallStringMaxBytes] bytes that every
	// attempt of the same action sends, and no other action does. A
	// [Caller] sends the pgonce key it derived.
	MetaKey = "io.github.pgonce/key"
	// MetaRunID and MetaStep name the action of a tools/call request by
	// its run and its position in the run: a string, and an integer from
	// 0. A [Guard] derives the key from them, the tool and the canonical
	// arguments, as pgonce derives every step call's.
	MetaRunID = "io.github.pgonce/run_id"
	MetaStep  = "io.github.pgonce/step"
	// MetaObservation holds, in a result pgonce made rather than the tool
	// (an action in progress, a conflict, invalid arguments, …), the
	// observation it reports: the JSON object of [outbox.Observation].
	MetaObservation = "io.github.pgonce/observation"
	// MetaAction holds, in every result of a guarded call (the tool's own,
	// fresh or replayed, and those pgonce made), how pgonce answered it: an
	// [ActionMark], the object {"key": …, "replayed": …, "in_progress": …}.
	// It is the one part of a replayed result that differs from the first
	// answer: the content, structured content and the tool's own _meta are
	// the stored bytes. [ActionMarkOf] reads it.
	MetaAction = "io.github.pgonce/action"
)

// ActionMark is how pgonce answered a call: the value of [MetaAction] in a
// result's _meta.
type ActionMark struct {
	// Key is the action's pgonce key, when the call named one pgonce could
	// derive; empty for arguments that are not a JSON object. A [Guard]
	// writes the server's key, a [Caller] the key it derived and sent.
	Key outbox.Key `json:"key,omitempty"`
	// Replayed reports a result that belongs to an earlier call of the
	// action: stored, and handed back without running the tool again.
	Replayed bool `json:"replayed"`
	// InProgress reports that the action is running elsewhere: the result
	// is pgonce's "in progress", and the call should be sent again later.
	InProgress bool `json:"in_progress"`
}

// ActionMarkOf returns the mark pgonce put in res's _meta ([MetaAction]), and
// whether it has one: a result of a call that no guard or caller answered has
// none.
func ActionMarkOf(res *mcp.CallToolResult) (ActionMark, bool) {
	if res == nil {
		return ActionMark{}, false
	}
	return markOf(res.Meta)
}

// markOf reads the mark in a _meta, decoded from JSON or set by pgonce.
func markOf(meta map[string]any) (ActionMark, bool) {
	v, ok := meta[MetaAction]
	if !ok {
		return ActionMark{}, false
	}
	b, err := json.Marshal(v)
	if err != nil {
		return ActionMark{}, false
	}
	var mark ActionMark
	if err := json.Unmarshal(b, &mark); err != nil {
		return ActionMark{}, false
	}
	return mark, true
}

// maxSafeStep is the largest step a JSON number carries exactly.
const maxSafeStep = 1<<53 - 1

// errNoAction means a request's _meta names no action.
var errNoAction = errors.New("no action named")

// action is how a request names its action: a key, or a run and a step.
type action struct {
	key   string
	runID string
	step  int64
}

// actionOf reads the action a request's _meta names. It returns errNoAction
// when it names none, and an error saying what is wrong with one that is
// malformed, as pgonce would refuse it: a key or run id that is not a
// non-empty string of at most [outbox.CallStringMaxBytes] bytes of UTF-8
// without NUL, or a step that is not an integer from 0 to 2^53-1. A key takes
// precedence over a run and a step, which are then ignored, malformed or not,
// as [outbox.Call] ignores them beside a key.
func actionOf(meta mcp.Meta) (action, error) {
	if v, ok := meta[MetaKey]; ok {
		key, ok := v.(string)
		if !ok || !validString(key) {
			return action{}, fmt.Errorf("_meta %q must be a non-empty string of at most %d bytes of UTF-8 without NUL, got %s",
				MetaKey, outbox.CallStringMaxBytes, describe(v))
		}
		return action{key: key}, nil
	}
	runValue, hasRun := meta[MetaRunID]
	stepValue, hasStep := meta[MetaStep]
	if !hasRun && !hasStep {
		return action{}, errNoAction
	}
	runID, ok := runValue.(string)
	if !ok || !validString(runID) {
		return action{}, fmt.Errorf("_meta %q must be a non-empty string of at most %d bytes of UTF-8 without NUL beside %q, got %s",
			MetaRunID, outbox.CallStringMaxBytes, MetaStep, describe(runValue))
	}
	step, ok := stepOf(stepValue)
	if !ok {
		return action{}, fmt.Errorf("_meta %q must be an integer from 0 to 2^53-1 beside %q, got %s", MetaStep, MetaRunID, describe(stepValue))
	}
	return action{runID: runID, step: step}, nil
}

// validString reports whether s can name an action in a [outbox.Call]: not
// empty, at most [outbox.CallStringMaxBytes] bytes of valid UTF-8, without
// NUL (PostgreSQL text cannot hold it).
func validString(s string) bool {
	return s != "" && len(s) <= outbox.CallStringMaxBytes && utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}

// stepOf reads a step from a _meta value: a JSON number that is a whole
// number in range, as a float64 or json.Number, or a Go integer.
func stepOf(v any) (int64, bool) {
	switch v := v.(type) {
	case float64:
		if v < 0 || v > maxSafeStep || v != math.Trunc(v) {
			return 0, false
		}
		return int64(v), true
	case json.Number:
		n, err := v.Int64()
		return n, err == nil && n >= 0 && n <= maxSafeStep
	case int:
		return int64(v), v >= 0 && int64(v) <= maxSafeStep
	case int64:
		return v, v >= 0 && v <= maxSafeStep
	default:
		return 0, false
	}
}

// describe shows a _meta value in an error message, briefly.
func describe(v any) string {
	if v == nil {
		return "nothing"
	}
	b, err := json.Marshal(v)
	if err != nil || len(b) > 64 {
		return fmt.Sprintf("a %T", v)
	}
	return string(b)
}

// StepMeta returns the _meta that names an action by its run and its
// position in the run, for [mcp.CallToolParams.Meta].
func StepMeta(runID string, step int64) mcp.Meta {
	return mcp.Meta{MetaRunID: runID, MetaStep: step}
}

// KeyMeta returns the _meta that names an action by an idempotency key, for
// [mcp.CallToolParams.Meta].
func KeyMeta(key string) mcp.Meta {
	return mcp.Meta{MetaKey: key}
}

// CallParams returns the tools/call parameters of a model's tool call, to
// call it on an MCP server: its tool, its arguments as the model wrote them
// (a [Caller] canonicalises them; empty is {}) and its run and step in _meta.
// The call's id and tenant are not sent.
func CallParams(call toolcall.Call) *mcp.CallToolParams {
	args := json.RawMessage(call.Arguments)
	if len(args) == 0 {
		args = json.RawMessage("{}")
	}
	return &mcp.CallToolParams{Name: call.Tool, Arguments: args, Meta: StepMeta(call.RunID, call.Step)}
}
