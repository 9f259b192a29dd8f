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

// InProgress reports whether any of outs is still in progress: another
// attempt holds the action, or a dispatcher has not run it within the wait.
// A runtime had better not hand such an outcome to the model, which would ask
// again in a later message, at a later position, which is another action:
// run the same calls again after the observation's retry_after_ms instead,
// and call the model once every call has an outcome.
func InProgress(outs []Outcome) bool {
	for _, out := range outs {
		if out.Observation().Status == outbox.ObservationInProgress {
			return true
		}
	}
	return false
}
