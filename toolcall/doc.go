// Package toolcall is the rule that pgonce's agent adapters share: how a
// model's tool call becomes a pgonce call, and how its outcome becomes the
// tool result the model reads. It knows no agent SDK. The adapters, modules
// of their own under agents/ (pgonceopenai, pgonceanthropic, pgoncemcp),
// translate each SDK's messages to and from it, so the core module never
// depends on an agent SDK; a runtime with an SDK of its own uses it directly.
//
// # Keys from the conversation, never from the model's text
//
// A tool call's key is derived from where the call stands in its run and from
// what it asks, never from anything else the model wrote:
//
//   - The run is the runtime's: the conversation, session or task it
//     persists ([Turn.RunID], and [Turn.Tenant] when it has tenants).
//   - The step is the call's position in the run. The run's tool calls are
//     numbered from 0 in the order of the conversation: the i-th call (from
//     0) of a message whose earlier messages asked for n calls in all takes
//     step n+i ([Turn.FirstStep], [Turn.Call]). After a crash, the runtime
//     recomputes every step from its persisted conversation; the adapters
//     count the calls of an SDK's message history for it.
//   - The tool is the name the model called, mapped by [Config.ToolNameFunc]
//     when the registered name differs.
//   - The arguments are the model's argument text, canonicalised
//     ([Arguments], RFC 8785): key order, spacing, number spelling and string
//     escaping never change a key.
//
// The id the model gives a call (call_…, toolu_…) never goes into the key:
// a model writes a new one every time it asks, so a re-asked action would
// run again. It is echoed in the tool result, so the model can match the
// two, and stored with the key as metadata ("tool_call_id"), for operators.
//
// So a call asked again at the same step with the same tool and arguments,
// however the model spelled them, is the same action: it runs once, and every
// ask gets its outcome. The same step with another tool or other arguments (a
// model that re-plans while re-asking) is a conflict, and nothing runs.
// Persist the model's message before you run its calls (with
// [Executor.SubmitTx], in the same transaction as the claims): a message
// asked again after a crash would otherwise be a new plan whose calls may
// shift.
//
// # Running calls
//
// An [Executor] runs calls through an [outbox.Client] whose registry holds
// the tools: inline with [outbox.Client.Do] ([Inline], the default), or
// submitted for a dispatcher and waited for ([Dispatched]); either waits at
// most [Config.Wait] for an outcome that another attempt is producing.
// [Executor.SubmitTx] claims a message's calls in the caller's own
// transaction, beside the runtime's record of the message; [Executor.Run]
// after the commit runs (or waits for) them.
//
// # What the model reads
//
// Every outcome, errors included, is an [Outcome], and its [Outcome.Text] is
// the tool result: the JSON of [outbox.ObservationFor], one stable shape
// with a message the model can act on (in progress, conflict, invalid
// arguments, …). A succeeded or failed action's text is the same bytes on
// every ask, the provider's stored response verbatim: the observation the
// model reads does not say which ask ran the action (Replayed is left out;
// [outbox.Result.Replayed] still tells the runtime), because a model whose
// first ask was lost in a crash has asked once, and because a conversation
// rebuilt after a crash should be the same bytes, prompt caches included.
package toolcall
