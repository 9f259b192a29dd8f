package idempotency

import "errors"

// ErrInvalidConfig is returned by [NewPgx] and [New] for an invalid
// [Config].
var ErrInvalidConfig = errors.New("invalid idempotency config")

// ErrToolNotRegistered is returned by [NewPgx] and [New], together with
// [ErrInvalidConfig], when [Config.Tool] is not registered in the client's
// registry by [Register]: missing, or registered for dispatchers to run.
var ErrToolNotRegistered = errors.New("idempotency tool not registered")
