package outbox

import (
	"encoding/json"
	"time"
)

// Result describes a key as one request found or left it.
type Result struct {
	// Key is the action's idempotency key.
	Key Key
	// State is where the key stands.
	State State
	// Created reports whether the request this Result answers created the
	// key: true only for the [Client.SubmitTx], [Client.Submit] or
	// [Client.Do] whose insert won, and for [Client.WaitResult] given that
	// Result. A finished result with Created false is a replay (see
	// [Result.Replayed]). [Client.Get] and [Client.Wait], which know the key
	// alone, always report false.
	Created bool
	// Tool is the key's tool.
	Tool string
	// Response holds the provider's response, verbatim, when State is
	// [StateSucceeded].
	Response json.RawMessage
	// Failure holds the stored failure, verbatim, when State is
	// [StateFailed].
	Failure json.RawMessage
	// Attempts counts the claims of the key so far: every provider attempt,
	// and every reconciler resolution, which takes the key under a new
	// attempt number to fence out the worker that held it.
	Attempts int
	// CreatedAt is when the key was claimed.
	CreatedAt time.Time
	// UpdatedAt is when the key last changed.
	UpdatedAt time.Time
	// CompletedAt is when the key reached a final state, or zero.
	CompletedAt time.Time
	// RetryAfter suggests, while the key is pending or in flight, when to
	// ask again. Zero otherwise.
	RetryAfter time.Duration
	// LastError says why the last attempt of a finished or needs-review key
	// did not succeed, for operators; empty otherwise. A pending key's last
	// error is in [Inspection.Queue].
	LastError string
}

// Replayed reports whether r answers a duplicate with an outcome that
// belongs to an earlier request: r is succeeded or failed, and the request
// r answers did not create the key. Of all the requests that derive one
// key, exactly one, the one that created it, gets its outcome with Replayed
// false, provided it reads the outcome with [Client.WaitResult] (or from
// [Client.Do]); every other one, in any process, gets true.
func (r Result) Replayed() bool {
	return !r.Created && (r.State == StateSucceeded || r.State == StateFailed)
}

// Observation returns what a model should see of r: [ObservationFor] with
// a nil error.
func (r Result) Observation() Observation {
	return ObservationFor(r, nil)
}
