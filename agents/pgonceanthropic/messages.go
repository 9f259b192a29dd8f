package pgonceanthropic

import (
	"context"

	"github.com/anthropics/anthropic-sdk-go/v2"

	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/toolcall"
)

// blockToolUse is the type of a content block that calls a tool of the
// runtime's.
const blockToolUse = "tool_use"

// Executor runs the tool calls of Claude models through a pgonce client,
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

// MessageTurn locates the next reply of a conversation in run runID: its
// first tool call's step is the number of tool_use blocks in the assistant
// messages of messages. Pass the conversation as it stood before the reply,
// as the runtime persisted it; recounted after a crash from the same
// messages, it gives the same turn.
func MessageTurn(runID string, messages []anthropic.MessageParam) toolcall.Turn {
	var n int64
	for _, m := range messages {
		if m.OfAssistant == nil {
			continue
		}
		for _, block := range m.OfAssistant.Content {
			if block.OfToolUse != nil {
				n++
			}
		}
	}
	return toolcall.Turn{RunID: runID, FirstStep: n}
}

// MessageCalls returns the tool calls of a reply, one per tool_use block, in
// order, located by turn: the i-th is step turn.FirstStep + i, whatever its
// id. Server tools' blocks (server_tool_use) are not the runtime's to run.
func MessageCalls(turn toolcall.Turn, msg anthropic.Message) []toolcall.Call {
	var calls []toolcall.Call
	for _, block := range msg.Content {
		if block.Type != blockToolUse {
			continue
		}
		use := block.AsToolUse()
		calls = append(calls, turn.Call(len(calls), use.ID, use.Name, string(use.Input)))
	}
	return calls
}

// ToolResultBlocks returns one tool_result block per outcome, in order, as
// the user message after the reply takes them: the call's id, the outcome's
// text ([toolcall.Outcome.Text]) and is_error for every outcome but a
// success.
func ToolResultBlocks(outs []toolcall.Outcome) []anthropic.ContentBlockParamUnion {
	blocks := make([]anthropic.ContentBlockParamUnion, len(outs))
	for i, out := range outs {
		blocks[i] = anthropic.NewToolResultBlock(out.Call.ID, out.Text(), out.IsError())
	}
	return blocks
}

// ToolResults runs the tool calls of msg, a reply located by turn (see
// [MessageTurn]), concurrently and each at most once per action, and returns
// the tool_result blocks that answer them, in order: send them in the user
// message after msg. Every outcome is a block, never an error or a panic.
func (e *Executor[TTx]) ToolResults(ctx context.Context, turn toolcall.Turn, msg anthropic.Message) []anthropic.ContentBlockParamUnion {
	return ToolResultBlocks(e.Run(ctx, MessageCalls(turn, msg)...))
}

// SubmitMessageTx claims the tool calls of msg in tx, the caller's
// transaction, beside the runtime's record of msg (see
// [toolcall.Executor.SubmitTx]). After the commit, [Executor.ToolResults]
// with the same turn and message runs them and answers. An error means tx
// must be rolled back.
func (e *Executor[TTx]) SubmitMessageTx(ctx context.Context, tx TTx, turn toolcall.Turn, msg anthropic.Message) ([]toolcall.Outcome, error) {
	return e.SubmitTx(ctx, tx, MessageCalls(turn, msg)...)
}
