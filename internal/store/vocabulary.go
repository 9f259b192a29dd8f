package store

import "fmt"

// Delivery says how a tool's outcome is made certain after an attempt whose
// outcome is unknown. It is stored in the key table as a smallint, NULL for
// DeliveryByKey, the common mode, which then costs no byte. outbox exports
// it as outbox.Delivery.
type Delivery int

const (
	// DeliveryByKey means the provider deduplicates on the key (outbox's
	// IdempotentByKey).
	DeliveryByKey Delivery = iota
	// DeliveryByLookup means the provider can be asked whether the action
	// happened (outbox's LookupByNaturalID).
	DeliveryByLookup
	// DeliveryAtMostOnce means neither: an uncertain attempt goes to review.
	DeliveryAtMostOnce
	// DeliveryTransactional means the provider's effect is a write in the
	// transaction that records its outcome (outbox's Transactional): an
	// attempt either committed with its outcome or rolled back, so none is
	// ever uncertain.
	DeliveryTransactional
)

// String returns the delivery's name.
func (d Delivery) String() string {
	switch d {
	case DeliveryByKey:
		return "idempotent_by_key"
	case DeliveryByLookup:
		return "lookup_by_natural_id"
	case DeliveryAtMostOnce:
		return "at_most_once"
	case DeliveryTransactional:
		return "transactional"
	}
	return fmt.Sprintf("Delivery(%d)", int(d))
}

// State is where a key stands. outbox exports it as outbox.State, whose
// constants document each state. The key table stores StateOpen for both
// StatePending and StateInFlight: a lease tells them apart.
type State string

// The states, as outbox documents them.
const (
	StatePending     State = "pending"
	StateInFlight    State = "in_flight"
	StateSucceeded   State = "succeeded"
	StateFailed      State = "failed"
	StateNeedsReview State = "needs_review"
	StateExpired     State = "expired"
	StateCancelled   State = "cancelled"

	// StateOpen is how the key table stores a pending or in-flight key.
	StateOpen State = "open"
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
