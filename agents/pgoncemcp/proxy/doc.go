// Package proxy is an MCP proxy that makes the side-effecting tools of any
// MCP server exactly-once, or reviewed, without changing the server: it
// serves MCP to clients and forwards to one upstream MCP server, a command
// it starts over stdio or a streamable-HTTP URL, and runs every tools/call
// of a side-effecting tool through pgonce with the key rules of package
// pgoncemcp. Command pgonce-mcp-proxy (agents/pgoncemcp/cmd) runs it from a
// configuration file; `pgonce mcp-proxy` starts that command.
//
// # What it does with a call
//
// The proxy lists the upstream's tools as they are. A call of a read-only
// tool (annotated readOnlyHint, or configured read_only) passes straight
// through. A call of any other tool names its action in its _meta, by a key
// ([pgoncemcp.MetaKey]) or by a run and a step ([pgoncemcp.MetaRunID],
// [pgoncemcp.MetaStep]), and runs inline through [outbox.Client.Do]:
//
//   - the first call of an action claims it, is forwarded with the key in
//     its _meta, and its result is stored;
//   - a later call gets the stored result verbatim, and nothing is sent;
//   - a call while the first is in flight gets a result marked as an error
//     that says "in progress, retry after …";
//   - the same key with other arguments, or another tool, is a conflict;
//   - the upstream's own errors, a result marked as an error or a JSON-RPC
//     error, come back as the upstream sent them.
//
// # Delivery
//
// Each tool's delivery, set in the configuration file, says what happens to
// a call whose outcome is unknown because the proxy died between sending it
// and recording the answer. The reconciler (run inside pgonce-mcp-proxy, or
// `pgonce reconcile`) settles it once its lease has expired:
//
//   - [DeliveryByKey], for an upstream that deduplicates on the key in
//     _meta: the call is sent again with the same key, and the upstream
//     answers without acting twice;
//   - [DeliveryAtMostOnce], the default, for any other upstream: the call
//     goes to review ([outbox.StateNeedsReview]) and is never sent again
//     until an operator resolves it (the console, `pgonce resolve`).
//
// # Configuration
//
//	{
//	  "upstream": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory"]},
//	  "schema": "pgonce",
//	  "tools": {"create_entities": {"delivery": "at_most_once"}}
//	}
//
// See [Config] for every field.
package proxy
