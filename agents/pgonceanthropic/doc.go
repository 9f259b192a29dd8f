// Package pgonceanthropic runs the tool calls of Claude models exactly once,
// for runtimes built on the Anthropic Go SDK
// (github.com/anthropics/anthropic-sdk-go/v2): a model that asks for
// refund(order=8842, amount="42.00") gets one refund whatever the retries,
// crashes and re-asks, and reads the same tool result on every ask.
//
// It is a module of its own, so that pgonce's core module never depends on an
// agent SDK. It follows the rule of package toolcall, which all of pgonce's
// agent adapters share: a call's key comes from the run and the call's
// position in it, which the runtime recomputes from its persisted
// conversation, and from the canonical input; never from the id the model
// gave the tool_use block (toolu_…) nor from any other text the model wrote.
//
// # Messages
//
// Each tool the model may call is a tool registered in the client's
// [outbox.Registry], under the tool's name ([toolcall.Config.ToolNameFunc]
// maps names that differ). After each reply that stops for tool use:
//
//	turn := pgonceanthropic.MessageTurn(runID, params.Messages) // the conversation before the reply
//	results := exec.ToolResults(ctx, turn, *msg)
//	params.Messages = append(params.Messages, msg.ToParam(), anthropic.NewUserMessage(results...))
//
// ToolResults returns one tool_result block per tool_use block, in order,
// each carrying the block's id, the observation's JSON ([toolcall.Outcome.Text])
// and is_error for every outcome but a success: the provider's stored response
// byte for byte, the same bytes on every ask; in progress, a conflict, invalid
// input or an unknown tool as observations the model can act on. It never
// panics and never returns an error.
//
// [Executor.SubmitMessageTx] claims a reply's calls in the caller's
// transaction, beside the runtime's record of the reply; ToolResults after the
// commit runs them (or waits for a dispatcher, in [toolcall.Dispatched] mode)
// and answers.
//
// # The tool runner
//
// An existing [anthropic.BetaToolRunner] becomes exactly-once without
// changing its loop: register each of its tools as a pgonce tool run by
// [Provider], and give the runner the tools [Executor.RunnerTools] returns
// in their place:
//
//	registry.Register("refund", pgonceanthropic.Provider(refundTool), outbox.IdempotentByKey)
//	...
//	var runner *anthropic.BetaToolRunner
//	tools, err := exec.RunnerTools(pgonceanthropic.RunnerConfig{
//		RunID:    runID,
//		Messages: func() []anthropic.BetaMessageParam { return runner.Messages() },
//	}, refundTool)
//	runner = client.Beta.Messages.NewToolRunner(tools, params, pgonceanthropic.RunnerOptions(nil)...)
//	msg, err := runner.RunToCompletion(ctx)
//
// Each call the runner makes is located in the runner's conversation: the
// step of its tool_use block in the last assistant message, whose id
// [RunnerOptions] hands to the call, so that identical blocks of one message
// each read their own position's outcome whatever order the runner's
// concurrent calls arrive in. A success returns the tool's own result blocks,
// stored and replayed verbatim; any other outcome is returned as an error
// whose text is the observation's JSON, which the runner sends as an is_error
// tool_result.
//
// The runner's tool code runs as the provider, under the action's request
// ([toolcall.RequestFromContext]): a tool that passes the key downstream can
// be registered [outbox.IdempotentByKey]; one that cannot had better be
// [outbox.AtMostOnce], whose uncertain attempt goes to review rather than
// running again.
//
// # Outcomes the model should not decide
//
// An outcome in progress (another worker holds the action; a dispatcher has
// not run it within the wait) is best not handed to the model: a model that
// asks again in a later message asks at a later position, which is another
// action. Run the same reply's calls again after retry_after_ms instead
// ([toolcall.InProgress] says when), and call the model once every call has
// an outcome.
package pgonceanthropic
