package toolcall

import "github.com/pgonce/pgonce/outbox"

// Outcome is what became of one tool call: the call, and the Result and
// error the client returned for it (an error before any SQL, such as
// [ErrInvalidArguments], leaves Result zero).
type Outcome struct {
	Call   Call
	Result outbox.Result
	Err    error
}

// Observation returns what the model reads of the call:
// [outbox.ObservationFor] of its Result and error, without Replayed, so that
// an action's outcome is the same observation on every ask.
func (o Outcome) Observation() outbox.Observation {
	obs := outbox.ObservationFor(o.Result, o.Err)
	obs.Replayed = false
	return obs
}

// Text returns the tool result the model reads: the observation's JSON
// ([outbox.Observation.JSON]), with a succeeded action's response and a
// failed one's failure embedded byte for byte as the provider returned them.
// For a finished action it is the same bytes on every ask.
func (o Outcome) Text() string {
	return string(o.Observation().JSON())
}

// IsError reports whether the tool result should be marked as an error (an
// SDK's is_error, isError): for every status but succeeded. A failed action,
// an action in progress, a conflict or invalid arguments gave the model no
// result to use.
func (o Outcome) IsError() bool {
	return o.Observation().Status != outbox.ObservationSucceeded
}
