package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgonce/pgonce/internal/dbpgx"
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
	// Fingerprint hashes the tool and the canonical arguments.
	Fingerprint string
	// ExpiresAt is when retention may prune the key, or zero.
	ExpiresAt time.Time
	// Queue describes the key's outbox entry while it is pending or in
	// flight; nil otherwise.
	Queue *QueueEntry
	// Resolutions are the operator decisions recorded for the key, oldest
	// first.
	Resolutions []ResolutionRecord
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
	var inspection Inspection
	err := c.store.Pgx(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		row, err := q.KeyGet(ctx, db, &dbpgx.KeyGetParams{Key: string(key), Now: c.nowParam()})
		if err != nil {
			return err
		}
		inspection = Inspection{
			Result:      c.resultFromRow(row, false),
			Tenant:      row.Tenant,
			RunID:       row.RunID,
			Step:        row.Step,
			BusinessKey: row.BusinessKey,
			NaturalID:   row.NaturalID,
			Fingerprint: row.Fingerprint,
		}
		if row.ExpiresAt != nil {
			inspection.ExpiresAt = *row.ExpiresAt
		}
		args, err := q.KeyGetArgs(ctx, db, &dbpgx.KeyGetArgsParams{Key: string(key)})
		if err != nil {
			return err
		}
		inspection.Args = args
		queue, err := q.OutboxGet(ctx, db, &dbpgx.OutboxGetParams{Key: string(key)})
		switch {
		case err == nil:
			entry := &QueueEntry{AvailableAt: queue.AvailableAt, Ambiguous: queue.Ambiguous}
			if queue.LeaseUntil != nil {
				entry.LeaseUntil = *queue.LeaseUntil
			}
			if queue.Worker != nil {
				entry.Worker = *queue.Worker
			}
			if queue.FirstAttemptedAt != nil {
				entry.FirstAttemptedAt = *queue.FirstAttemptedAt
			}
			if queue.LastError != nil {
				entry.LastError = *queue.LastError
			}
			inspection.Queue = entry
		case !errors.Is(store.InterpretError(err), store.ErrNoRows):
			return err
		}
		resolutions, err := q.ResolutionListByKey(ctx, db, &dbpgx.ResolutionListByKeyParams{Key: string(key)})
		if err != nil {
			return err
		}
		for _, r := range resolutions {
			inspection.Resolutions = append(inspection.Resolutions, ResolutionRecord{
				Action: ResolutionAction(r.Action), By: r.ResolvedBy, Reason: r.Reason, ResolvedAt: r.ResolvedAt,
			})
		}
		return nil
	})
	if errors.Is(err, store.ErrNoRows) {
		res, getErr := c.Get(ctx, key)
		return Inspection{Result: res}, getErr
	}
	if err != nil {
		return Inspection{}, fmt.Errorf("inspect key: %w", err)
	}
	return inspection, nil
}

// Stats summarises a schema for operators.
type Stats struct {
	// Keys counts keys per tool and state; tombstones count as
	// [StateExpired].
	Keys map[string]map[State]int64 `json:"keys"`
	// Pending and InFlight count open keys.
	Pending  int64 `json:"pending"`
	InFlight int64 `json:"in_flight"`
	// ExpiredLeases counts in-flight keys whose lease has ended: crashed or
	// stuck attempts the reconciler has not resolved yet.
	ExpiredLeases int64 `json:"expired_leases"`
	// OldestPending is how long the oldest due pending key has waited.
	OldestPending time.Duration `json:"oldest_pending_ns"`
	// NeedsReview counts keys waiting for an operator.
	NeedsReview int64 `json:"needs_review"`
	// Tombstones counts pruned keys still remembered.
	Tombstones int64 `json:"tombstones"`
}

// Stats counts keys by tool and state and summarises the queue. It reads the
// whole key table: meant for operators and alerting, not for hot paths.
func (c *Client[TTx]) Stats(ctx context.Context) (Stats, error) {
	stats := Stats{Keys: map[string]map[State]int64{}}
	err := c.store.Pgx(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		counts, err := q.KeyCountByToolAndState(ctx, db)
		if err != nil {
			return err
		}
		for _, row := range counts {
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
		queue, err := q.OutboxStats(ctx, db, &dbpgx.OutboxStatsParams{Now: c.nowParam()})
		if err != nil {
			return err
		}
		stats.Pending, stats.InFlight, stats.ExpiredLeases = queue.Pending, queue.InFlight, queue.ExpiredLeases
		stats.OldestPending = time.Duration(queue.OldestPendingMs) * time.Millisecond
		return nil
	})
	if err != nil {
		return Stats{}, fmt.Errorf("stats: %w", err)
	}
	return stats, nil
}
