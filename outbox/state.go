package outbox

import "github.com/pgonce/pgonce/internal/store"

// State is where a key stands. Its Terminal method reports whether the
// state is final (succeeded, failed, cancelled or expired; a needs-review key
// is not, since an operator may still send it back), and InProgress whether
// it is pending or in flight.
type State = store.State

const (
	// StatePending means the key is claimed and waits for a dispatcher:
	// nothing has run yet, or a failed attempt waits for its retry.
	StatePending State = store.StatePending
	// StateInFlight means an attempt holds the key under a lease and its provider
	// may be running.
	StateInFlight State = store.StateInFlight
	// StateSucceeded means the provider's response is stored and replayed.
	StateSucceeded State = store.StateSucceeded
	// StateFailed means a permanent failure is stored and replayed.
	StateFailed State = store.StateFailed
	// StateNeedsReview means nobody could determine the outcome; nothing runs
	// until an operator resolves the key.
	StateNeedsReview State = store.StateNeedsReview
	// StateExpired means the key outlived its retention; only its tombstone,
	// with the completion time, remains, and the action never runs again
	// while it does.
	StateExpired State = store.StateExpired
	// StateCancelled means an operator cancelled the key while it was
	// pending ([Client.Cancel]): the action never ran and never runs, and
	// every duplicate is told so, until an operator retries it
	// ([Client.Retry]).
	StateCancelled State = store.StateCancelled
)

// Stored key states, as the store reads them. Pending and in flight are
// both "open"; a lease tells them apart.
const (
	dbStateOpen        = string(store.StateOpen)
	dbStateSucceeded   = string(store.StateSucceeded)
	dbStateFailed      = string(store.StateFailed)
	dbStateNeedsReview = string(store.StateNeedsReview)
	dbStateExpired     = string(store.StateExpired)
	dbStateCancelled   = string(store.StateCancelled)
)
