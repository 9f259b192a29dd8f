package pgonceopenai

import (
	"context"
	"encoding/json"

	"github.com/openai/openai-go/v3"

	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/toolcall"
)

// Executor runs the tool calls of OpenAI models through a pgonce client,
// exactly once per action. It embeds the [toolcall.Executor] it is built on,
// whose Run and SubmitTx take calls from any source. It is safe for
// concurrent use.
type Executor[TTx any] struct {
	*toolcall.Executor[TTx]
}

// New returns an executor over client, whose registry holds the tools the
// model may call, configured by config (its zero value runs calls inline).
// It returns an error matching [toolcall.ErrInvalidConfig] for a nil client
// or an invalid config.
func New[TTx any](client *outbox.Client[TTx], config toolcall.Config) (*Executor[TTx], error) {
	exec, err := toolcall.NewExecutor(client, config)
	if err != nil {
		return nil, err
	}
	return &Executor[TTx]{Executor: exec}, nil
}

// ChatTurn locates the next reply of a Chat Completions conversation in run
// runID: its first tool call's step is the number of tool calls the assistant
// messages of messages asked for. Pass the conversation as it stood before
// the reply, as the runtime persisted it; recounted after a crash from the
// same messages, it gives the same turn.
func ChatTurn(runID string, messages []openai.ChatCompletionMessageParamUnion) toolcall.Turn {
	var n int64
	for _, m := range messages {
		if m.OfAssistant != nil {
			n += int64(len(m.OfAssistant.ToolCalls))
		}
	}
	return toolcall.Turn{RunID: runID, FirstStep: n}
}

// ChatCalls returns the tool calls of an assistant message, in order, located
// by turn: the i-th is step turn.FirstStep + i, whatever its id. A function
// call's arguments are the model's argument string; a custom tool's free-form
// input becomes the arguments {"input": <the input>}.
func ChatCalls(turn toolcall.Turn, msg openai.ChatCompletionMessage) []toolcall.Call {
	calls := make([]toolcall.Call, len(msg.ToolCalls))
	for i, tc := range msg.ToolCalls {
		if tc.Type == "custom" {
			calls[i] = turn.Call(i, tc.ID, tc.Custom.Name, customArguments(tc.Custom.Input))
			continue
		}
		calls[i] = turn.Call(i, tc.ID, tc.Function.Name, tc.Function.Arguments)
	}
	return calls
}

// ChatToolMessages returns one tool message per outcome, in order, as the
// Chat Completions API takes them after the assistant message: the call's id
// and the outcome's text ([toolcall.Outcome.Text]).
func ChatToolMessages(outs []toolcall.Outcome) []openai.ChatCompletionMessageParamUnion {
	msgs := make([]openai.ChatCompletionMessageParamUnion, len(outs))
	for i, out := range outs {
		msgs[i] = openai.ToolMessage(out.Text(), out.Call.ID)
	}
	return msgs
}

// ToolMessages runs the tool calls of msg, an assistant message located by
// turn (see [ChatTurn]), concurrently and each at most once per action, and
// returns the tool messages that answer them, in order: append them after
// msg. Every outcome is a message, never an error or a panic: a finished
// action's stored response byte for byte, or an observation the model can
// act on (in progress, conflict, invalid arguments, unknown tool, …).
func (e *Executor[TTx]) ToolMessages(ctx context.Context, turn toolcall.Turn, msg openai.ChatCompletionMessage) []openai.ChatCompletionMessageParamUnion {
	return ChatToolMessages(e.Run(ctx, ChatCalls(turn, msg)...))
}

// SubmitChatTx claims the tool calls of msg in tx, the caller's transaction,
// beside the runtime's record of msg (see [toolcall.Executor.SubmitTx]).
// After the commit, [Executor.ToolMessages] with the same turn and message
// runs them and answers. An error means tx must be rolled back.
func (e *Executor[TTx]) SubmitChatTx(ctx context.Context, tx TTx, turn toolcall.Turn, msg openai.ChatCompletionMessage) ([]toolcall.Outcome, error) {
	return e.SubmitTx(ctx, tx, ChatCalls(turn, msg)...)
}

// customArguments returns the arguments of a custom tool call, whose input is
// free-form text: the object {"input": text}.
func customArguments(input string) string {
	b, err := json.Marshal(map[string]string{"input": input})
	if err != nil {
		// A string always marshals; invalid UTF-8 is replaced, not refused.
		return "{}"
	}
	return string(b)
}
