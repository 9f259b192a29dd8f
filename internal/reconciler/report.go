package reconciler

import "time"

// Outcome names what the engine did with a row, as counted in a [Report].
// Package reconcile exports it by alias.
type Outcome string

// Outcomes counted in a [Report].
const (
	// OutcomeRequeued: back to pending; the key is presented again.
	OutcomeRequeued Outcome = "requeued"
	// OutcomeFound: a lookup found the effect; its response is recorded.
	OutcomeFound Outcome = "found"
	// OutcomeNeedsReview: the outcome cannot be made certain.
	OutcomeNeedsReview Outcome = "needs_review"
	// OutcomeLookupFailed: the lookup failed; the row is pending again and
	// its next attempt looks up first.
	OutcomeLookupFailed Outcome = "lookup_failed"
	// OutcomeSuperseded: someone else recorded the row first.
	OutcomeSuperseded Outcome = "superseded"
	// OutcomeFailed: a lookup found that the action failed for good; the
	// key fails with that failure.
	OutcomeFailed Outcome = "failed"
)

// Report counts what one [Engine.RunOnce] examined and did. Package
// reconcile converts it to its documented, JSON-ready Report.
type Report struct {
	// Examined counts the expired rows taken, per tool.
	Examined map[string]int
	// Resolved counts, per tool and outcome, what was done with them.
	Resolved map[string]map[Outcome]int
	// SkippedUnregistered counts expired rows of tools the client does not
	// register, per tool. They are left alone.
	SkippedUnregistered map[string]int
	// StalePending counts pending rows due for longer than
	// [Config.StalePending].
	StalePending int
	// OldestStalePending is how long the oldest of them has been due.
	OldestStalePending time.Duration
	// Pruned counts what [Config.PruneFunc] removed.
	Pruned Pruned
}

// Pruned counts what retention removed: keys turned into tombstones, and
// tombstones deleted.
type Pruned struct {
	Keys       int64
	Tombstones int64
}

func newReport() Report {
	return Report{
		Examined:            map[string]int{},
		Resolved:            map[string]map[Outcome]int{},
		SkippedUnregistered: map[string]int{},
	}
}

func (r *Report) count(tool string, outcome Outcome) {
	if r.Resolved[tool] == nil {
		r.Resolved[tool] = map[Outcome]int{}
	}
	r.Resolved[tool][outcome]++
}
