// Package pgoncemcp makes the side-effecting tools of the Model Context
// Protocol exactly-once, on both sides of the wire, for the MCP Go SDK
// (github.com/modelcontextprotocol/go-sdk): a server whose refund tool runs
// once per action however often a client sends the call, and an agent whose
// calls of remote tools are exactly-once end to end when the server honours
// the key it sends.
//
// It is a module of its own, so that pgonce's core module never depends on an
// agent SDK. It follows the rule of package toolcall, which all of pgonce's
// agent adapters share: an action is named by the run and the call's position
// in it, or by a key, and by its canonical arguments; never by a request id or
// any other text a model wrote.
//
// # Naming the action
//
// A tools/call request names its action in its _meta, under names of
// pgonce's own: an idempotency key ([MetaKey]), or the run and the call's step
// in it ([MetaRunID] and [MetaStep]):
//
//	{"method": "tools/call", "params": {"name": "refund",
//	  "arguments": {"order": 8842, "amount": "42.00"},
//	  "_meta": {"io.github.pgonce/run_id": "run-8842", "io.github.pgonce/step": 3}}}
//
// [StepMeta], [KeyMeta] and [CallParams] build it. The protocol has no
// mechanism of its own: a tool's idempotentHint annotation is a hint, and an
// idempotency key on tools/call is a proposal.
//
// # Server side
//
// A [Guard] is a receiving middleware that runs each guarded tool's call at
// most once per action and replays the stored [mcp.CallToolResult] to every
// later call, the same bytes but for pgonce's mark in its _meta ([MetaAction]:
// the key, and whether the result is replayed or in progress):
//
//	guard, err := pgoncemcp.NewGuard(client, pgoncemcp.ServerConfig{})
//	server := mcp.NewServer(&mcp.Implementation{Name: "payments", Version: "1.0.0"}, nil)
//	server.AddReceivingMiddleware(guard.Middleware)
//	err = pgoncemcp.AddTool(server, guard, &mcp.Tool{Name: "refund"}, outbox.IdempotentByKey, refund)
//
// A duplicate while the first call runs gets a result marked as an error
// whose text says "in progress, retry after …"; tools annotated read-only pass
// through; a call that names no action is refused with a message for the
// client's developer, or passed through ([ServerConfig.Anonymous]). The
// handler runs under the action's request ([toolcall.RequestFromContext]),
// whose key it passes downstream. The server runs a reconciler over the
// client (package reconcile) to settle the calls a crash left in flight.
//
// # Client side
//
// A [Caller] is a sending middleware for an agent's [mcp.ClientSession]: it
// derives the key on the agent's side, runs the call through pgonce and sends
// it with the key in its _meta, so that a guarded server runs it once whatever
// the agent's retries and crashes:
//
//	caller, err := pgoncemcp.NewCaller(client, pgoncemcp.ClientConfig{})
//	err = caller.Register("refund", outbox.IdempotentByKey) // the server honours the key
//	mcpClient.AddSendingMiddleware(caller.Middleware)
//	...
//	res, err := session.CallTool(ctx, pgoncemcp.CallParams(turn.Call(i, call.ID, call.Name, call.Arguments)))
//
// Registered [outbox.IdempotentByKey], a call whose outcome is unknown is sent
// again with the same key, and the server's guard answers it: exactly once
// end to end. Registered [outbox.AtMostOnce], for a server that does not
// honour the key, it is never sent again: at most once, or reviewed by an
// operator.
package pgoncemcp
