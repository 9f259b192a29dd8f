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
