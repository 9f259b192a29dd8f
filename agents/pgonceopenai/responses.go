package pgonceopenai

import (
	"context"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"

	"github.com/pgonce/pgonce/toolcall"
)

// The output item types that call a tool of the runtime's.
const (
	itemFunctionCall   = "function_call"
	itemCustomToolCall = "custom_tool_call"
)

// ResponsesTurn locates the next response of a Responses conversation in run
// runID, for a runtime that sends the whole input with every request: its
// first tool call's step is the number of function_call and custom_tool_call
// items in input. Pass the input as it stood before the response. A runtime
// that chains responses with previous_response_id keeps the count itself
// instead ([toolcall.Turn.Next]).
func ResponsesTurn(runID string, input []responses.ResponseInputItemUnionParam) toolcall.Turn {
	var n int64
	for _, item := range input {
		if item.OfFunctionCall != nil || item.OfCustomToolCall != nil {
			n++
		}
	}
	return toolcall.Turn{RunID: runID, FirstStep: n}
}

// ResponsesCalls returns the tool calls among a response's output items, in
// order, located by turn: the i-th function_call or custom_tool_call item is
// step turn.FirstStep + i, whatever its call_id. A function in a namespace is
// named namespace.name; a custom tool's free-form input becomes the
// arguments {"input": <the input>}. Other items (messages, reasoning, hosted
// tools) are not the runtime's to run.
func ResponsesCalls(turn toolcall.Turn, output []responses.ResponseOutputItemUnion) []toolcall.Call {
	var calls []toolcall.Call
	for _, item := range output {
		switch item.Type {
		case itemFunctionCall:
			fc := item.AsFunctionCall()
			name := fc.Name
			if fc.Namespace != "" {
				name = fc.Namespace + "." + fc.Name
			}
			calls = append(calls, turn.Call(len(calls), fc.CallID, name, fc.Arguments))
		case itemCustomToolCall:
			cc := item.AsCustomToolCall()
			calls = append(calls, turn.Call(len(calls), cc.CallID, cc.Name, customArguments(cc.Input)))
		}
	}
	return calls
}

// ResponsesOutputs returns the input items that answer the tool calls of
// output, one per outcome of [ResponsesCalls], in order: a
// function_call_output item for a function call, a custom_tool_call_output
// item for a custom tool call, each with the call's call_id and the outcome's
// text ([toolcall.Outcome.Text]).
func ResponsesOutputs(output []responses.ResponseOutputItemUnion, outs []toolcall.Outcome) []responses.ResponseInputItemUnionParam {
	custom := make(map[string]bool)
	for _, item := range output {
		if item.Type == itemCustomToolCall {
			custom[item.CallID] = true
		}
	}
	items := make([]responses.ResponseInputItemUnionParam, len(outs))
	for i, out := range outs {
		if custom[out.Call.ID] {
			items[i] = responses.ResponseInputItemParamOfCustomToolCallOutput(out.Call.ID, out.Text())
			continue
		}
		items[i] = responses.ResponseInputItemParamOfFunctionCallOutput(out.Text())
		items[i].OfFunctionCallOutput.CallID = openai.String(out.Call.ID)
	}
	return items
}

// FunctionCallOutputs runs the tool calls among a response's output items,
// located by turn, concurrently and each at most once per action, and returns
// the items that answer them, in order (see [ResponsesOutputs]): send them as
// the next request's input. Every outcome is an item, never an error or a
// panic.
func (e *Executor[TTx]) FunctionCallOutputs(ctx context.Context, turn toolcall.Turn, output []responses.ResponseOutputItemUnion) []responses.ResponseInputItemUnionParam {
	return ResponsesOutputs(output, e.Run(ctx, ResponsesCalls(turn, output)...))
}

// SubmitResponsesTx claims the tool calls among a response's output items in
// tx, the caller's transaction, beside the runtime's record of the response
// (see [toolcall.Executor.SubmitTx]). After the commit,
// [Executor.FunctionCallOutputs] with the same turn and output runs them and
// answers. An error means tx must be rolled back.
func (e *Executor[TTx]) SubmitResponsesTx(ctx context.Context, tx TTx, turn toolcall.Turn, output []responses.ResponseOutputItemUnion) ([]toolcall.Outcome, error) {
	return e.SubmitTx(ctx, tx, ResponsesCalls(turn, output)...)
}
