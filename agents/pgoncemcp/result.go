package pgoncemcp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/toolcall"
)

// answer returns the result of a tools/call request whose action pgonce
// answered with res and err: the stored result of the tool, decoded the same
// way for the request that ran it and for every replay, so that each gets
// the same bytes but for the mark; or, for any other outcome, a result
// pgonce makes ([observationResult]). Either carries the mark
// ([MetaAction]).
func answer(res outbox.Result, err error) *mcp.CallToolResult {
	out := toolcall.Outcome{Result: res, Err: err}
	obs := out.Observation()
	mark := ActionMark{Key: obs.Key, Replayed: res.Replayed(), InProgress: obs.Status == outbox.ObservationInProgress}
	var stored json.RawMessage
	switch obs.Status {
	case outbox.ObservationSucceeded:
		stored = res.Response
	case outbox.ObservationFailed:
		stored = res.Failure
	}
	if stored != nil {
		if result, err := decodeResult(stored); err == nil {
			// A result stored from a guarded server carries the server's
			// mark: a result the server replayed is a replay here too.
			if prior, ok := markOf(result.Meta); ok && prior.Replayed {
				mark.Replayed = true
			}
			return withMark(result, mark)
		}
	}
	return withMark(observationResult(obs), mark)
}

// withMark puts mark in res's _meta, in place of any mark it had.
func withMark(res *mcp.CallToolResult, mark ActionMark) *mcp.CallToolResult {
	if res.Meta == nil {
		res.Meta = mcp.Meta{}
	}
	res.Meta[MetaAction] = mark
	return res
}

// decodeResult decodes a stored CallToolResult. Its structured content and
// its _meta are kept as the JSON they were, numbers included, rather than
// decoded into Go values that would round them.
func decodeResult(stored json.RawMessage) (*mcp.CallToolResult, error) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(stored, &members); err != nil {
		return nil, err
	}
	if _, ok := members["content"]; !ok {
		return nil, fmt.Errorf("not a tool result: no content")
	}
	var res mcp.CallToolResult
	if err := json.Unmarshal(stored, &res); err != nil {
		return nil, err
	}
	if raw, ok := members["structuredContent"]; ok {
		res.StructuredContent = raw
	}
	if raw, ok := members["_meta"]; ok {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		var meta map[string]any
		if err := dec.Decode(&meta); err != nil {
			return nil, err
		}
		res.Meta = meta
	}
	return &res, nil
}

// observationResult is the result pgonce makes for an outcome that is not
// the tool's own: marked as an error, its text a line a model or a developer
// reads ("in progress, retry after 250ms: …") followed by the observation's
// JSON, which its _meta holds as well ([MetaObservation]).
func observationResult(obs outbox.Observation) *mcp.CallToolResult {
	doc := obs.JSON()
	return &mcp.CallToolResult{
		Meta:    mcp.Meta{MetaObservation: json.RawMessage(doc)},
		Content: []mcp.Content{&mcp.TextContent{Text: headline(obs) + ": " + string(doc)}},
		IsError: true,
	}
}

// headline says in a few words what an observation reports.
func headline(obs outbox.Observation) string {
	switch obs.Status {
	case outbox.ObservationInProgress:
		return fmt.Sprintf("in progress, retry after %v", time.Duration(obs.RetryAfterMS)*time.Millisecond)
	case outbox.ObservationUnavailable:
		return fmt.Sprintf("unavailable, retry after %v", time.Duration(obs.RetryAfterMS)*time.Millisecond)
	default:
		return strings.ReplaceAll(string(obs.Status), "_", " ")
	}
}

// ObservationOf returns the observation that a result pgonce made reports
// (an action in progress, a conflict, invalid arguments, …), and whether res
// is such a result; a tool's own result, replayed or not, is not.
func ObservationOf(res *mcp.CallToolResult) (outbox.Observation, bool) {
	if res == nil {
		return outbox.Observation{}, false
	}
	v, ok := res.Meta[MetaObservation]
	if !ok {
		return outbox.Observation{}, false
	}
	b, err := json.Marshal(v)
	if err != nil {
		return outbox.Observation{}, false
	}
	var obs outbox.Observation
	if err := json.Unmarshal(b, &obs); err != nil || obs.Status == "" {
		return outbox.Observation{}, false
	}
	return obs, true
}
