package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/pgonce/pgonce/internal/store"
)

// Inspection is everything pgonce knows about one key, for operators.
type Inspection struct {
	Result
	// Args are the canonical arguments the key was derived from.
	Args []byte
	// Tenant, RunID, Step, BusinessKey and NaturalID are the call's
	// identity.
	Tenant      string
	RunID       string
	Step        int64
	BusinessKey string
	NaturalID   string
	// Fingerprint hashes the tool and the canonical arguments. It is empty
	// for a tombstone of a step call, which keeps neither.
	Fingerprint string
	// ExpiresAt is when retention may prune the key, or zero.
	ExpiresAt time.Time
	// Queue describes the key's outbox entry while it is pending or in
	// flight; nil otherwise.
	Queue *QueueEntry
	// Resolutions are the operator decisions recorded for the key, oldest
	// first: resolutions, cancellations and retries.
	Resolutions []ResolutionRecord
	// Metadata is the call's [Call.Metadata] as stored by the submit that
	// created the key; nil when it had none, and for a tombstone.
	Metadata map[string]string
	// Delivery and KeyRetention are the tool's delivery mode and provider
	// key retention stored with the key at submit, which the reconciler
	// uses; zero for a tombstone.
	Delivery     Delivery
	KeyRetention time.Duration
	// AttemptHistory is every attempt of the key, in attempt order: its
	// start, worker, how it ended and why it did not succeed. A key that
	// did not finish at its first attempt keeps each attempt when it ends
	// (retried, gone to review, failed, its lease run out, and the one that
	// finally succeeded); the attempt in flight now comes last, read from
	// its lease; a key that succeeded at its first attempt, which keeps no
	// attempt, shows that one from its own times, without a worker. A
	// tombstone keeps none, nor does a key whose attempts ended before
	// pgonce kept them.
	AttemptHistory []AttemptRecord
	// ExpiredFrom is, for a tombstone ([StateExpired]), the state its key
	// finished in before retention pruned it: [StateSucceeded],
	// [StateFailed] or [StateCancelled]. Empty for every other key.
	ExpiredFrom State
}

// QueueEntry is the outbox entry of an open key: its queue fields.
type QueueEntry struct {
	AvailableAt      time.Time
	LeaseUntil       time.Time
	Worker           string
	FirstAttemptedAt time.Time
	// Ambiguous reports that an earlier attempt may have acted.
	Ambiguous bool
	// LastError is the error of the last failed attempt.
	LastError string
}

// Inspect returns the full record of key; for a pruned key, its tombstone
// ([StateExpired], without response or arguments). It returns [ErrNotFound]
// for an unknown key.
func (c *Client[TTx]) Inspect(ctx context.Context, key Key) (Inspection, error) {
	if _, err := ParseKey(string(key)); err != nil {
		return Inspection{}, err
	}
	// One statement at a time, each on a connection of its own: none holds
	// a connection while another waits for one.
	var inspection Inspection
	err := func() error {
		row, err := c.store.Executor().KeyGet(ctx, string(key), c.nowParam())
		if err != nil {
			return err
		}
		inspection = Inspection{
			Result:       c.resultFromRow(row, false),
			Tenant:       row.Tenant,
			RunID:        row.RunID,
			Step:         row.Step,
			BusinessKey:  row.BusinessKey,
			NaturalID:    row.NaturalID,
			Fingerprint:  row.Fingerprint,
			Metadata:     decodeMetadata(row.Metadata),
			Delivery:     row.Delivery,
			KeyRetention: row.KeyRetention,
		}
		if row.ExpiresAt != nil {
			inspection.ExpiresAt = *row.ExpiresAt
		}
		details, err := c.store.KeyDetails(ctx, string(key))
		if err != nil {
			return err
		}
		inspection.Args, inspection.ExpiredFrom = details.Args, State(details.ExpiredState)
		if inspection.Fingerprint == "" && inspection.Args != nil {
			// A step call's fingerprint is not stored: its key covers it.
			inspection.Fingerprint = fingerprint(row.Tool, inspection.Args)
		}
		queue, err := c.store.QueueEntry(ctx, string(key))
		switch {
		case err == nil:
			inspection.Queue = &QueueEntry{
				AvailableAt:      queue.AvailableAt,
				LeaseUntil:       queue.LeaseUntil,
				Worker:           queue.Worker,
				FirstAttemptedAt: queue.FirstAttemptedAt,
				Ambiguous:        queue.Ambiguous,
				LastError:        queue.LastError,
			}
		case !errors.Is(err, store.ErrNoRows):
			return err
		}
		resolutions, err := c.store.ResolutionsByKey(ctx, string(key))
		if err != nil {
			return err
		}
		for _, r := range resolutions {
			inspection.Resolutions = append(inspection.Resolutions, ResolutionRecord{
				Action: ResolutionAction(r.Action), By: r.ResolvedBy, Reason: r.Reason, ResolvedAt: r.ResolvedAt,
			})
		}
		kept, err := c.store.Attempts(ctx, string(key))
		if err != nil {
			return err
		}
		inspection.AttemptHistory = attemptHistory(inspection.Result, inspection.Queue, details, kept)
		return nil
	}()
	if errors.Is(err, store.ErrNoRows) {
		res, getErr := c.Get(ctx, key)
		return Inspection{Result: res}, getErr
	}
	if err != nil {
		return Inspection{}, fmt.Errorf("inspect key: %w", err)
	}
	return inspection, nil
}

// StatsExactPagesMax is the largest key table, in pages of the server's
// block size (8 kB unless PostgreSQL was built otherwise), that
// [Client.Stats] counts exactly: 1280 pages, 10 MB, some 25,000 finished
// keys. A larger table is never read whole.
const StatsExactPagesMax = 1280

// Stats summarises a schema for operators.
type Stats struct {
	// Keys counts keys per tool and state; tombstones count as
	// [StateExpired] under the empty tool, for they keep no tool. A state
	// without keys is left out. The counts of the states in Estimated are
	// estimates; all others are exact.
	Keys map[string]map[State]int64 `json:"keys"`
	// Estimated lists the states whose counts in Keys, and Tombstones for
	// [StateExpired], are estimates from the planner's statistics rather
	// than counts: [StateSucceeded] and [StateExpired] when the key table
	// is larger than [StatsExactPagesMax]. It is empty when every figure is
	// exact.
	Estimated []State `json:"estimated"`
	// Pending and InFlight count open keys.
	Pending  int64 `json:"pending"`
	InFlight int64 `json:"in_flight"`
	// ExpiredLeases counts in-flight keys whose lease has ended: crashed or
	// stuck attempts the reconciler has not resolved yet.
	ExpiredLeases int64 `json:"expired_leases"`
	// OldestPending is how long the oldest due pending key has waited.
	OldestPending time.Duration `json:"oldest_pending_ns"`
	// OldestPendingByTool is, for every tool with a pending key, how long
	// its oldest due pending key has waited; 0 for a tool none of whose
	// pending keys is due yet. A tool without pending keys has no entry.
	OldestPendingByTool map[string]time.Duration `json:"oldest_pending_by_tool_ns"`
	// NeedsReview counts keys waiting for an operator.
	NeedsReview int64 `json:"needs_review"`
	// Tombstones counts pruned keys still remembered.
	Tombstones int64 `json:"tombstones"`
}

// Stats counts keys by tool and state and summarises the queue, without
// reading the whole of a large key table. Pending, in-flight, failed,
// cancelled and needs-review keys, the expired leases and the oldest
// pending keys are exact: they are read from the partial indexes that hold
// those keys alone (pgonce_key_list_idx, pgonce_key_due_idx,
// pgonce_key_lease_idx). Succeeded keys and tombstones, nearly all of a
// large table, are counted exactly in a table of at most
// [StatsExactPagesMax] pages and estimated above that, from the table's
// size and the statistics ANALYZE keeps (autovacuum analyzes the key table
// after 2% of its rows changed); [Stats.Estimated] says which. Before a
// large table was first analyzed, its succeeded keys and tombstones count
// as none, and a tool too rare to be among the column's most common values
// is missing unless one of its keys is in a state counted exactly. The
// figures come from several statements, not one snapshot.
func (c *Client[TTx]) Stats(ctx context.Context) (Stats, error) {
	stats := Stats{Keys: map[string]map[State]int64{}}
	counts, err := c.store.KeyCounts(ctx, c.nowParam(), StatsExactPagesMax)
	if err != nil {
		return Stats{}, fmt.Errorf("stats: %w", err)
	}
	if counts.Estimated {
		stats.Estimated = []State{StateSucceeded, StateExpired}
	}
	for _, row := range counts.Counts {
		if stats.Keys[row.Tool] == nil {
			stats.Keys[row.Tool] = map[State]int64{}
		}
		stats.Keys[row.Tool][State(row.State)] = row.Keys
		switch State(row.State) {
		case StateNeedsReview:
			stats.NeedsReview += row.Keys
		case StateExpired:
			stats.Tombstones += row.Keys
		}
	}
	stats.OldestPendingByTool = counts.OldestPending
	queue, err := c.store.QueueStats(ctx, c.nowParam())
	if err != nil {
		return Stats{}, fmt.Errorf("stats: %w", err)
	}
	stats.Pending, stats.InFlight, stats.ExpiredLeases = queue.Pending, queue.InFlight, queue.ExpiredLeases
	stats.OldestPending = queue.OldestPending
	return stats, nil
}

// IsEstimated reports whether the count of state in [Stats.Keys] is an
// estimate.
func (s Stats) IsEstimated(state State) bool {
	return slices.Contains(s.Estimated, state)
}
