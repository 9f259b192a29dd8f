package outbox

import (
	"time"

	"github.com/pgonce/pgonce/internal/store"
)

// AttemptOutcome is how one attempt of a key ended, in an
// [AttemptRecord].
type AttemptOutcome string

const (
	// AttemptSucceeded means the attempt's provider succeeded and its response
	// was stored.
	AttemptSucceeded AttemptOutcome = "succeeded"
	// AttemptFailed means the attempt failed the key for good, with a
	// permanent failure or at the attempt limit.
	AttemptFailed AttemptOutcome = "failed"
	// AttemptNeedsReview means the attempt could not tell what its provider did,
	// and sent the key to review.
	AttemptNeedsReview AttemptOutcome = "needs_review"
	// AttemptRetry means the attempt failed in a way that changed nothing, and
	// the key went back to pending for another attempt after a backoff.
	AttemptRetry AttemptOutcome = "retry"
	// AttemptUncertain means the attempt may have acted (a timeout, say), and
	// the key went back to pending for another attempt, which settles the
	// outcome by the tool's [Delivery] first.
	AttemptUncertain AttemptOutcome = "uncertain"
	// AttemptLeaseExpired means the attempt's lease ran out before it recorded
	// anything (its worker crashed, or stopped answering), and the
	// reconciler took the key over under a new attempt.
	AttemptLeaseExpired AttemptOutcome = "lease_expired"
	// AttemptInFlight means the attempt holds the key now. It is never stored:
	// [Client.Inspect] reads it from the key's lease.
	AttemptInFlight AttemptOutcome = "in_flight"
)

// AttemptRecord is one attempt of a key, in [Inspection.AttemptHistory].
type AttemptRecord struct {
	// Attempt is the attempt's number, from 1; it is the
	// [Request.Attempt] its provider saw.
	Attempt int `json:"attempt"`
	// StartedAt is when the attempt claimed the key, by the database's
	// clock.
	StartedAt time.Time `json:"started_at"`
	// EndedAt is when the attempt ended, or when the reconciler took over
	// an attempt whose lease ran out; zero while it is in flight.
	EndedAt time.Time `json:"ended_at,omitzero"`
	// Worker is the dispatcher, client or reconciler that ran the attempt
	// (its WorkerID); empty when not recorded.
	Worker string `json:"worker,omitempty"`
	// Outcome is how the attempt ended.
	Outcome AttemptOutcome `json:"outcome"`
	// Error is why the attempt did not succeed, as stored with the key;
	// empty for a success and for a lease that ran out.
	Error string `json:"error,omitempty"`
}

// attemptHistory is [Inspection.AttemptHistory] for a key read as row and
// details, whose kept attempts are kept: the attempts pgonce_attempt holds,
// then the attempt in flight now (read from the lease), or the first and
// only attempt of a key that succeeded at it, which nothing else records.
func attemptHistory(res Result, queue *QueueEntry, details *store.KeyDetails, kept []store.AttemptRecord) []AttemptRecord {
	history := make([]AttemptRecord, 0, len(kept)+1)
	for _, a := range kept {
		history = append(history, AttemptRecord{
			Attempt: a.Attempt, StartedAt: a.StartedAt, EndedAt: a.EndedAt,
			Worker: a.Worker, Outcome: AttemptOutcome(a.Outcome), Error: a.Error,
		})
	}
	last := 0
	if len(history) > 0 {
		last = history[len(history)-1].Attempt
	}
	switch {
	case res.State == StateInFlight && queue != nil && res.Attempts > last:
		// An in-flight key's updated_at is its attempt's claim.
		history = append(history, AttemptRecord{
			Attempt: res.Attempts, StartedAt: res.UpdatedAt, Worker: queue.Worker, Outcome: AttemptInFlight,
		})
	case res.State == StateSucceeded && res.Attempts == 1 && last == 0:
		first := AttemptRecord{Attempt: 1, EndedAt: res.CompletedAt, Outcome: AttemptSucceeded}
		if details != nil && details.FirstAttemptedAt != nil {
			first.StartedAt = *details.FirstAttemptedAt
		}
		history = append(history, first)
	}
	return history
}
