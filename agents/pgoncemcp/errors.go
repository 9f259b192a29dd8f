package pgoncemcp

import "errors"

// ErrInvalidConfig is returned by [NewGuard] and [NewCaller] for a nil client
// or an invalid config.
var ErrInvalidConfig = errors.New("invalid pgoncemcp config")

// ErrInvalidTool is returned by [Guard.Protect], [AddTool] and
// [Caller.Register] for a tool that cannot be registered: a name that is not
// a pgonce tool name once mapped, a name already registered, or a delivery
// that needs a lookup, which a tool call cannot offer.
var ErrInvalidTool = errors.New("invalid pgoncemcp tool")

// ErrNoAction is returned by a [Caller]'s middleware, before anything is
// sent, for a call of a side-effecting tool whose _meta names no action: set
// [StepMeta] or [KeyMeta] in [mcp.CallToolParams.Meta], or build the
// parameters with [CallParams].
var ErrNoAction = errors.New("pgoncemcp: the call names no action: set the run and step (StepMeta) or a key (KeyMeta) in CallToolParams.Meta")

// ErrInvalidMeta is returned by a [Caller]'s middleware, before anything is
// sent, for a call of a side-effecting tool whose _meta names its action in
// a malformed way: a key or run id that is not a non-empty string of at most
// [outbox.CallStringMaxBytes] bytes of UTF-8 without NUL, a step that is not
// an integer from 0 to 2^53-1, or a run without a step. A [Guard] refuses the
// same _meta with a JSON-RPC invalid-params error.
var ErrInvalidMeta = errors.New("pgoncemcp: invalid _meta")
