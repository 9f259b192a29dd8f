package store

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgonce/pgonce/internal/dbpgx"
)

// ToolControl is the flow control of one tool, as [Store.ToolControls]
// reads it.
type ToolControl struct {
	Tool string
	// MaxInFlight is 0 for no limit.
	MaxInFlight int
	// Rate is calls per second, 0 for no limit, with up to Burst at once.
	Rate  float64
	Burst int
	// NotBefore, when set, is when the tool's provider may be called again
	// after it asked to slow down; it may lie in the past.
	NotBefore *time.Time
	// PausedAt is set while the tool is paused, with PausedBy and
	// PausedReason.
	PausedAt     *time.Time
	PausedBy     string
	PausedReason string
	UpdatedAt    time.Time
	// OpenKeys reports that a key of the tool is pending or in flight.
	OpenKeys bool
	// Now is the database's clock at the read.
	Now time.Time
}

// ToolControls reads the flow control of every tool that has any, by name.
func (s *Store) ToolControls(ctx context.Context, now *time.Time) ([]*ToolControl, error) {
	var controls []*ToolControl
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		rows, err := q.ToolList(ctx, db, &dbpgx.ToolListParams{Now: now})
		for _, row := range rows {
			c := &ToolControl{
				Tool:      row.Tool,
				NotBefore: row.NotBefore,
				PausedAt:  row.PausedAt,
				UpdatedAt: row.UpdatedAt,
				OpenKeys:  row.OpenKeys,
				Now:       row.Now,
			}
			if row.MaxInFlight != nil {
				c.MaxInFlight = int(*row.MaxInFlight)
			}
			if row.Rate != nil && row.Burst != nil {
				c.Rate, c.Burst = *row.Rate, int(*row.Burst)
			}
			if row.PausedBy != nil {
				c.PausedBy = *row.PausedBy
			}
			if row.PausedReason != nil {
				c.PausedReason = *row.PausedReason
			}
			controls = append(controls, c)
		}
		return err
	})
	return controls, err
}

// ToolOpenKeys reports whether a key of tool is pending or in flight.
func (s *Store) ToolOpenKeys(ctx context.Context, tool string) (open bool, err error) {
	err = s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		open, err = q.ToolOpenKeys(ctx, db, &dbpgx.ToolOpenKeysParams{Tool: tool})
		return err
	})
	return open, err
}

// ToolActParams say which tool an operator acts on, who and why, for
// [Store.ToolPause], [Store.ToolResume], [Store.ToolSetLimits] and
// [Store.ToolEndSlowDown].
type ToolActParams struct {
	Tool   string
	By     string
	Reason string
	// MaxInFlight, Rate and Burst are the limits of ToolSetLimits; nil is
	// no limit of that kind. Rate and Burst go together.
	MaxInFlight *int
	Rate        *float64
	Burst       *int
	// Channel, when not empty, is notified with tool:<name>.
	Channel string
	Now     *time.Time
}

// ToolPause pauses a tool and records the decision. changed is false, and
// nothing is recorded, when the tool was paused already.
func (s *Store) ToolPause(ctx context.Context, p *ToolActParams) (changed bool, err error) {
	err = s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		row, err := q.ToolPause(ctx, db, &dbpgx.ToolPauseParams{
			Tool: p.Tool, ActedBy: p.By, Reason: p.Reason, Channel: p.Channel, Now: p.Now,
		})
		if err == nil {
			changed = row.Changed > 0
		}
		return err
	})
	return changed, err
}

// ToolResume ends a tool's pause and records the decision. changed is
// false, and nothing is recorded, when the tool was not paused.
func (s *Store) ToolResume(ctx context.Context, p *ToolActParams) (changed bool, err error) {
	err = s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		row, err := q.ToolResume(ctx, db, &dbpgx.ToolResumeParams{
			Tool: p.Tool, ActedBy: p.By, Reason: p.Reason, Channel: p.Channel, Now: p.Now,
		})
		if err == nil {
			changed = row.Changed > 0
		}
		return err
	})
	return changed, err
}

// ToolEndSlowDown ends a tool's slow-down early, makes the keys it held due
// at once, and records the decision. changed is false, and nothing is
// recorded, when the tool was not slowed down.
func (s *Store) ToolEndSlowDown(ctx context.Context, p *ToolActParams) (changed bool, err error) {
	err = s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		row, err := q.ToolEndSlowDown(ctx, db, &dbpgx.ToolEndSlowDownParams{
			Tool: p.Tool, ActedBy: p.By, Reason: p.Reason, Channel: p.Channel, Now: p.Now,
		})
		if err == nil {
			changed = row.Changed > 0
		}
		return err
	})
	return changed, err
}

// ToolSetLimits sets a tool's limits and records the decision; nil limits
// clear them. changed is false when there was nothing to clear.
func (s *Store) ToolSetLimits(ctx context.Context, p *ToolActParams) (changed bool, err error) {
	params := &dbpgx.ToolSetLimitsParams{
		Tool: p.Tool, ActedBy: p.By, Reason: p.Reason, Channel: p.Channel, Now: p.Now,
		Rate: p.Rate,
	}
	if p.MaxInFlight != nil {
		v := int32(*p.MaxInFlight) //nolint:gosec // validated by the caller
		params.MaxInFlight = &v
	}
	if p.Burst != nil {
		v := int32(*p.Burst) //nolint:gosec // validated by the caller
		params.Burst = &v
	}
	err = s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		row, err := q.ToolSetLimits(ctx, db, params)
		if err == nil {
			changed = row.Changed > 0
		}
		return err
	})
	return changed, err
}

// ToolAction is one operator decision on a tool.
type ToolAction struct {
	At     time.Time
	Action string
	By     string
	Reason string
}

// ToolActions reads up to max decisions on tool, newest first.
func (s *Store) ToolActions(ctx context.Context, tool string, maxRows int) ([]ToolAction, error) {
	var actions []ToolAction
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		rows, err := q.ToolActionList(ctx, db, &dbpgx.ToolActionListParams{Tool: tool, MaxRows: int32(maxRows)}) //nolint:gosec // bounded by the caller
		for _, row := range rows {
			actions = append(actions, ToolAction{At: row.ActedAt, Action: row.Action, By: row.ActedBy, Reason: row.Reason})
		}
		return err
	})
	return actions, err
}

// ThrottleParams are the parameters of [Store.Throttle].
type ThrottleParams struct {
	Tool  string
	Delay time.Duration
	// Key and Attempt, when Key is not empty, name the attempt that was
	// told to slow down: it goes back to pending without spending the
	// attempt, with Ambiguous and LastError as [Store.Release] writes them.
	Key       string
	Attempt   int
	Ambiguous bool
	LastError string
	// Channel, when not empty, is notified with tool:<name> when the tool
	// had no flow control before.
	Channel string
	Now     *time.Time
}

// ThrottleResult is what [Store.Throttle] did.
type ThrottleResult struct {
	// NotBefore is the tool's not-before time now.
	NotBefore time.Time
	// Created reports that the tool had no flow control before.
	Created bool
	// Released reports that the attempt went back to pending.
	Released bool
}

// Throttle slows a tool down until Delay from now (or later, if it is
// already), and puts the attempt that was told to slow down, if any, back
// to pending without spending it.
func (s *Store) Throttle(ctx context.Context, p *ThrottleParams) (*ThrottleResult, error) {
	params := &dbpgx.ToolThrottleParams{
		Tool:      p.Tool,
		DelayMs:   p.Delay.Milliseconds(),
		Ambiguous: p.Ambiguous,
		LastError: p.LastError,
		Attempt:   int32(p.Attempt), //nolint:gosec // attempts stay small
		Channel:   p.Channel,
		Now:       p.Now,
	}
	if p.Key != "" {
		params.Key = keyDigest(p.Key)
	}
	var res *ThrottleResult
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		row, err := q.ToolThrottle(ctx, db, params)
		if err == nil {
			res = &ThrottleResult{NotBefore: row.NotBefore, Created: row.Inserted, Released: row.Released > 0}
		}
		return err
	})
	return res, err
}

// ToolBudget is a controlled tool's state at a claim, as locked: enough for
// the claimer to tell when the tool may have budget again.
type ToolBudget struct {
	Tool        string
	MaxInFlight int
	Paused      bool
	// NotBefore is set while the tool is slowed down.
	NotBefore *time.Time
	// Rate, Burst and Tokens are the bucket at the claim, before it spent
	// any; Rate is 0 for no rate limit.
	Rate   float64
	Burst  int
	Tokens float64
	// Waiting reports that a key of the tool was due at the claim.
	Waiting bool
	// Now is the clock the budget was taken at.
	Now time.Time
}

// ClaimControlled claims up to Max due pending keys of Tools, every one a
// tool with flow control, never more of a tool's keys than its free budget.
// It locks the tools' control rows in a transaction of its own, so that
// the claims of one tool, by any dispatcher, take their budget one after
// the other. It returns the claimed keys and the tools' budgets as the
// claim found them. A tool of Tools that has no budget in the result has no
// control row any more (cleared, or forgotten by this claim because it
// controls nothing: no limit, no pause, a slow-down that ended): its keys
// are for the plain claim.
//
// The transaction is one pipeline, one round trip: ToolLock, ToolForget
// and OutboxClaimControlled, sent together and run in one implicit
// transaction. Each statement takes its snapshot when it starts, so the
// claim, which starts once the lock is granted, reads what the claim it
// waited for committed. The claim reads the control rows of Tools that
// exist when it starts: those ToolLock locked and ToolForget kept, and, in
// the one case of a tool whose row was created (again) between the two
// statements, a row it did not lock, whose budget then bounds this claim
// without ordering it after other claims (as a claim made before a
// dispatcher learns of a new row, a plain one, is not bounded at all).
func (s *Store) ClaimControlled(ctx context.Context, p *ClaimBatchParams) ([]*ClaimedKey, []ToolBudget, error) {
	var (
		claimed []*ClaimedKey
		budgets []ToolBudget
	)
	lockParams := &dbpgx.ToolLockParams{Tools: p.Tools, Now: p.Now}
	forgetParams := &dbpgx.ToolForgetParams{Tools: p.Tools, Now: p.Now}
	claimParams := &dbpgx.OutboxClaimControlledParams{
		Now:             p.Now,
		Tools:           p.Tools,
		ReplicatedTools: p.ReplicatedTools,
		MaxRows:         int32(p.Max), //nolint:gosec // bounded by the caller's batch size
		LeaseMs:         p.Lease.Milliseconds(),
		Worker:          p.Worker,
	}
	var batch pgx.Batch
	queue := pgxTemplated{db: batchQueue{batch: &batch}, tpl: s.template}
	for _, err := range []error{
		func() error { _, err := s.queries.ToolLock(ctx, queue, lockParams); return err }(),
		func() error { _, err := s.queries.ToolForget(ctx, queue, forgetParams); return err }(),
		func() error { _, err := s.queries.OutboxClaimControlled(ctx, queue, claimParams); return err }(),
	} {
		if !queued(err) {
			return nil, nil, fmt.Errorf("queue controlled claim: %w", err)
		}
	}
	err := s.connFunc(ctx, func(conn *pgx.Conn) (err error) {
		results := conn.SendBatch(ctx, &batch)
		defer func() { err = cmp.Or(err, results.Close()) }()
		db := batchReplay{results: results}
		locked, err := s.queries.ToolLock(ctx, db, lockParams)
		if err != nil {
			return err
		}
		gone, err := s.queries.ToolForget(ctx, db, forgetParams)
		if err != nil {
			return err
		}
		rows, err := s.queries.OutboxClaimControlled(ctx, db, claimParams)
		if err != nil {
			return err
		}
		budgets = make([]ToolBudget, 0, len(locked))
		for _, row := range locked {
			if slices.Contains(gone, row.Tool) {
				continue
			}
			b := ToolBudget{Tool: row.Tool, Paused: row.Paused, NotBefore: row.NotBefore, Waiting: row.Waiting, Now: row.Now}
			if row.MaxInFlight != nil {
				b.MaxInFlight = int(*row.MaxInFlight)
			}
			if row.NotBefore != nil && !row.NotBefore.After(row.Now) {
				b.NotBefore = nil
			}
			if row.Rate != nil && row.Tokens != nil && row.RefilledAt != nil && row.Burst != nil {
				b.Rate, b.Burst = *row.Rate, int(*row.Burst)
				b.Tokens = min(float64(*row.Burst), *row.Tokens+*row.Rate*max(0, row.Now.Sub(*row.RefilledAt).Seconds()))
			}
			budgets = append(budgets, b)
		}
		for _, row := range rows {
			claimed = append(claimed, &ClaimedKey{
				Key:              keyText(row.Key),
				Scope:            hexText(row.Scope),
				Tool:             row.Tool,
				Attempt:          int(row.Attempt),
				Ambiguous:        row.Ambiguous,
				FirstAttemptedAt: row.FirstAttemptedAt,
				LeaseUntil:       row.LeaseUntil,
				NaturalID:        row.NaturalID,
				Args:             row.Args,
				Metadata:         row.Metadata,
				AvailableAt:      row.AvailableAt,
				Now:              row.Now,
			})
		}
		return nil
	})
	if err != nil {
		return nil, nil, s.interpretError(ctx, err)
	}
	return claimed, budgets, nil
}
