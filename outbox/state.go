package outbox

import "github.com/pgonce/pgonce/internal/store"

// State is where a key stands.
type State string

const (
	// StatePending means the key is claimed and waits for a dispatcher:
	// nothing has run yet, or a failed attempt waits for its retry.
	StatePending State = "pending"
	// StateInFlight means an attempt holds the key under a lease and its provider
	// may be running.
	StateInFlight State = "in_flight"
	// StateSucceeded means the provider's response is stored and replayed.
	StateSucceeded State = "succeeded"
	// StateFailed means a permanent failure is stored and replayed.
	StateFailed State = "failed"
	// StateNeedsReview means nobody could determine the outcome; nothing runs
	// until an operator resolves the key.
	StateNeedsReview State = "needs_review"
	// StateExpired means the key outlived its retention; only its tombstone,
	// with the completion time, remains, and the action never runs again
	// while it does.
	StateExpired State = "expired"
	// StateCancelled means an operator cancelled the key while it was
	// pending ([Client.Cancel]): the action never ran and never runs, and
	// every duplicate is told so, until an operator retries it
	// ([Client.Retry]).
	StateCancelled State = "cancelled"
)

// Terminal reports whether s is final: succeeded, failed, cancelled or
// expired. A needs-review key is not final, since an operator may still send
// it back.
func (s State) Terminal() bool {
	return s == StateSucceeded || s == StateFailed || s == StateCancelled || s == StateExpired
}

// InProgress reports whether s is pending or in flight.
func (s State) InProgress() bool {
	return s == StatePending || s == StateInFlight
}

// Stored key states, as the store reads them. Pending and in flight are
// both "open"; a lease tells them apart.
const (
	dbStateOpen        = store.StateOpen
	dbStateSucceeded   = store.StateSucceeded
	dbStateFailed      = store.StateFailed
	dbStateNeedsReview = store.StateNeedsReview
	dbStateExpired     = store.StateExpired
	dbStateCancelled   = store.StateCancelled
)
