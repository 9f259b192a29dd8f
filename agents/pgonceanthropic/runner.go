package pgonceanthropic

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/anthropics/anthropic-sdk-go/v2"

	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/toolcall"
)

// ErrInvalidRunner is returned by [Executor.RunnerTools] for a
// [RunnerConfig] without a run id or a Messages function.
var ErrInvalidRunner = errors.New("invalid tool runner config")

// ErrIdenticalCalls is the error a runner tool returns, without running
// anything, for a call that has identical tool_use blocks beside it in its
// message (the same tool, the same input, canonically) when the runner does
// not tell the call's block: each block is an action of its own, and without
// its id the call cannot know which of them it answers. Create the runner
// with [RunnerOptions].
var ErrIdenticalCalls = errors.New("pgonce: the tool call has identical tool_use blocks in its message and the runner does not say which one it answers, so it did not run: create the runner with pgonceanthropic.RunnerOptions")

// ErrNotInConversation is the error a runner tool returns, without running
// anything, for a call it cannot find in the last assistant message of the
// conversation [RunnerConfig.Messages] returns: its step would be unknown.
// It means Messages does not return the runner's conversation.
var ErrNotInConversation = errors.New("pgonce: the tool call is not in the conversation's last assistant message, so its step is unknown and it did not run")

// Provider returns an [outbox.Provider] that runs tool, the code of a tool
// of a tool runner: register it as the pgonce tool of the same name, so that
// the tools [Executor.RunnerTools] returns run it (inline, or through a
// dispatcher after a crash).
//
// It calls tool's Execute with the call's canonical input, under a context
// that carries the action's request ([toolcall.RequestFromContext]: the key,
// to pass downstream). The result blocks Execute returns are the response,
// stored as their JSON and replayed verbatim. An error Execute returns is its
// answer to the model, stored as the key's failure ({"error": "<its text>"},
// see [outbox.Permanent]) and replayed, unless it says otherwise: an error
// wrapped with [outbox.Ambiguous] (the effect may have happened), with
// [outbox.RetryAfter] (retry later; nothing happened), with
// [outbox.PermanentBody], or a context error (ambiguous) keeps its meaning.
func Provider(tool anthropic.BetaTool) outbox.Provider {
	return outbox.ProviderFunc(func(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
		blocks, err := tool.Execute(toolcall.ContextWithRequest(ctx, req), req.Args)
		if err != nil {
			return nil, toolError(err)
		}
		return json.Marshal(blocks)
	})
}

// toolError is what a tool's error means to pgonce: a final answer, unless it
// says otherwise.
func toolError(err error) error {
	var (
		retry     *outbox.RetryAfterError
		permanent *outbox.PermanentError
	)
	if outbox.IsAmbiguous(err) || errors.As(err, &retry) || errors.As(err, &permanent) {
		return err
	}
	return outbox.Permanent(err)
}

// RunnerConfig locates the calls of one tool runner in its run.
type RunnerConfig struct {
	// Tenant is the tenant of the run's calls; empty for none.
	Tenant string
	// RunID names the run. Required.
	RunID string
	// Messages returns the runner's conversation, in which each call is
	// located: usually the runner's own Messages method. A runner that
	// compacts its conversation (CompactBeforeNextTurn) drops the messages
	// whose calls the count starts from; give it then a function that returns
	// the whole conversation as the runtime persisted it. It is called
	// concurrently, once per call. Required.
	Messages func() []anthropic.BetaMessageParam
}

// OutcomeError is the error a runner tool returns for an outcome other than
// a success: its text is the observation's JSON ([toolcall.Outcome.Text]),
// which the runner sends to the model as an is_error tool_result.
type OutcomeError struct {
	Outcome toolcall.Outcome
}

// Error returns the observation's JSON.
func (e *OutcomeError) Error() string { return e.Outcome.Text() }

// RunnerTools returns tools for an [anthropic.BetaToolRunner] that stand for
// tools, with their names, descriptions and input schemas, and run each call
// through pgonce, at most once per action: each tool must be registered in the
// client's registry under its name, with [Provider]. Create the runner with
// [RunnerOptions] too.
//
// A call is located in the conversation config.Messages returns, among the
// tool_use blocks of its last assistant message: the block whose id the
// runner gives ([RunnerOptions]), else the one block of the call's tool whose
// input is the call's input, canonically; its step is its position in the
// run ([toolcall.Turn]), whatever the order in which the runner's concurrent
// calls arrive. A call that cannot be located runs nothing and returns
// [ErrNotInConversation]; a call with identical blocks beside it, from a
// runner without [RunnerOptions], runs nothing and returns
// [ErrIdenticalCalls].
//
// A success returns the tool's result blocks as they were stored, the same on
// every ask. Any other outcome (a failure, in progress, a conflict, invalid
// input) returns an [*OutcomeError], which the runner sends as an is_error
// tool_result.
//
// It returns [ErrInvalidRunner] for a config without a run id or a Messages
// function.
func (e *Executor[TTx]) RunnerTools(config RunnerConfig, tools ...anthropic.BetaTool) ([]anthropic.BetaTool, error) {
	if config.RunID == "" || config.Messages == nil {
		return nil, fmt.Errorf("%w: RunID and Messages are required", ErrInvalidRunner)
	}
	run := &runnerRun{config: config}
	wrapped := make([]anthropic.BetaTool, len(tools))
	for i, tool := range tools {
		wrapped[i] = &runnerTool[TTx]{BetaTool: tool, exec: e, run: run}
	}
	return wrapped, nil
}

// runnerTool is a tool of a runner run through pgonce.
type runnerTool[TTx any] struct {
	anthropic.BetaTool // the name, description and schema the model knows
	exec               *Executor[TTx]
	run                *runnerRun
}

// Execute locates the call in the runner's conversation and runs it through
// pgonce.
func (t *runnerTool[TTx]) Execute(ctx context.Context, input json.RawMessage) ([]anthropic.BetaToolResultBlockParamContentUnion, error) {
	id, _ := ctx.Value(toolUseIDKey{}).(string)
	call, err := t.run.locate(t.Name(), input, id)
	if err != nil {
		return nil, err
	}
	out := t.exec.Run(ctx, call)[0]
	if out.IsError() {
		return nil, &OutcomeError{Outcome: out}
	}
	var blocks []anthropic.BetaToolResultBlockParamContentUnion
	if err := json.Unmarshal(out.Result.Response, &blocks); err != nil {
		// A response that is not result blocks (one an operator recorded, say)
		// reads as the observation.
		return []anthropic.BetaToolResultBlockParamContentUnion{{OfText: &anthropic.BetaTextBlockParam{Text: out.Text()}}}, nil
	}
	return blocks, nil
}

// runnerRun is what the tools of one runner share: where their calls stand.
type runnerRun struct {
	config RunnerConfig
}

// locate returns the call of tool name with input, located in the last
// assistant message of the runner's conversation: the tool_use block id when
// the runner gave it, else the one block of the tool with the same input.
func (r *runnerRun) locate(name string, input json.RawMessage, id string) (toolcall.Call, error) {
	args, err := toolcall.Arguments(string(input))
	if err != nil {
		// It will not run, wherever it stands: the executor reads it as
		// invalid input.
		return toolcall.Call{Tenant: r.config.Tenant, RunID: r.config.RunID, Tool: name, Arguments: string(input)}, nil
	}
	messages := r.config.Messages()
	last := -1
	for i := len(messages) - 1; i >= 0; i-- {
		if messages[i].OfAssistant != nil {
			last = i
			break
		}
	}
	if last < 0 {
		return toolcall.Call{}, ErrNotInConversation
	}
	turn := toolcall.Turn{Tenant: r.config.Tenant, RunID: r.config.RunID, FirstStep: betaToolUses(messages[:last])}
	var positions []int
	var ids []string
	index := 0
	for _, block := range messages[last].OfAssistant.Content {
		use := block.OfToolUse
		if use == nil {
			continue
		}
		if use.Name == name && (id == "" || use.ID == id) {
			if canonical, err := outbox.Canonicalize(use.Input); err == nil && string(canonical) == string(args) {
				positions, ids = append(positions, index), append(ids, use.ID)
			}
		}
		index++
	}
	switch {
	case len(positions) == 0:
		return toolcall.Call{}, ErrNotInConversation
	case len(positions) > 1:
		// Two blocks of one id: a message no model writes, and one no call
		// can tell apart either.
		return toolcall.Call{}, ErrIdenticalCalls
	}
	return turn.Call(positions[0], ids[0], name, string(args)), nil
}

// betaToolUses counts the tool_use blocks of the assistant messages of
// messages.
func betaToolUses(messages []anthropic.BetaMessageParam) int64 {
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
	return n
}
