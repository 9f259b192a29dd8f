package oncetest

import "errors"

var (
	// ErrInvalidOpts is returned by [Drain] for a nil client or invalid
	// [DrainOpts], before anything runs.
	ErrInvalidOpts = errors.New("invalid oncetest options")

	// ErrDrainLimit is returned by [Drain] when it made [DrainOpts.MaxCalls]
	// attempts and calls are still due: providers that keep submitting new
	// calls, which a test would otherwise never see end.
	ErrDrainLimit = errors.New("drain limit reached with calls still due")
)
