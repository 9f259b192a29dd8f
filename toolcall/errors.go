package toolcall

import "errors"

// ErrInvalidArguments is returned by [Arguments] for a model's argument text
// that cannot be used: not JSON, JSON with no canonical form (see
// [outbox.Canonicalize]), or not a JSON object. It wraps the
// [*outbox.NotCanonicalError] that names the offending path and the reason,
// so [outbox.ObservationFor] reports it as invalid_arguments and the model
// can correct the call. Nothing runs for such a call.
var ErrInvalidArguments = errors.New("invalid tool arguments")

// ErrInvalidConfig is returned by [NewExecutor] for a nil client or an
// invalid [Config].
var ErrInvalidConfig = errors.New("invalid toolcall config")
