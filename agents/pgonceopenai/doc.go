// Package pgonceopenai runs the tool calls of OpenAI models exactly once, for
// runtimes built on the OpenAI Go SDK (github.com/openai/openai-go/v3): a
// model that asks for refund(order=8842, amount="42.00") gets one refund
// whatever the retries, crashes and re-asks, and reads the same tool result
// on every ask.
//
// It is a module of its own, so that pgonce's core module never depends on an
// agent SDK. It follows the rule of package toolcall, which all of pgonce's
// agent adapters share: a call's key comes from the run and the call's
// position in it, which the runtime recomputes from its persisted
// conversation, and from the canonical arguments; never from the id the model
// gave the call (call_…) nor from any other text the model wrote.
//
// # Chat Completions
//
// Each tool the model may call is a tool registered in the client's
// [outbox.Registry], under the function's name ([toolcall.Config.ToolNameFunc]
// maps names that differ). After each reply with tool calls:
//
//	turn := pgonceopenai.ChatTurn(runID, params.Messages) // the conversation before the reply
//	msg := completion.Choices[0].Message
//	params.Messages = append(params.Messages, msg.ToParam())
//	params.Messages = append(params.Messages, exec.ToolMessages(ctx, turn, msg)...)
//
// ToolMessages returns one tool message per call, in order, each carrying the
// call's id and the observation's JSON ([toolcall.Outcome.Text]): the
// provider's stored response byte for byte, the same bytes on every ask; in
// progress, a conflict, invalid arguments (the model's argument string is not
// JSON) or an unknown tool as observations the model can act on. It never
// panics and never returns an error: every failure is a tool result.
//
// # Responses
//
// The Responses API's function_call items are answered with
// function_call_output items, the same way. A runtime that chains responses
// with previous_response_id holds no history to count; it keeps the count in
// its own record of the run:
//
//	outputs := exec.FunctionCallOutputs(ctx, turn, resp.Output)
//	turn = turn.Next(len(outputs)) // kept with the response's id
//	params.PreviousResponseID = openai.String(resp.ID)
//	params.Input = responses.ResponseNewParamsInputUnion{OfInputItemList: outputs}
//
// A runtime that sends the whole input instead counts it with
// [ResponsesTurn].
//
// # Beside the runtime's own record
//
// [Executor.SubmitChatTx] and [Executor.SubmitResponsesTx] claim a reply's
// calls in the caller's transaction, beside the runtime's record of the reply,
// so that the claims and the record commit together; ToolMessages or
// FunctionCallOutputs after the commit runs them (or waits for a dispatcher,
// in [toolcall.Dispatched] mode) and answers.
//
// # Outcomes the model should not decide
//
// An outcome in progress (another worker holds the action; a dispatcher has
// not run it within the wait) is best not handed to the model: a model that
// asks again in a later message asks at a later position, which is another
// action. Run the same reply's calls again after retry_after_ms instead
// ([toolcall.InProgress] says when), and call the model once every call has an
// outcome.
package pgonceopenai
