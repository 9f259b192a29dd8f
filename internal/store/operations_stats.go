package store

import (
	"context"
	"math"
	"time"

	"github.com/pgonce/pgonce/internal/dbpgx"
)

// KeyCounts is what [Store.KeyCounts] found.
type KeyCounts struct {
	// Counts are the keys per tool and state (pending and in_flight for open
	// keys); tombstones count under the empty tool. States without keys are
	// left out.
	Counts []*StateCount
	// Estimated reports that the succeeded and expired counts are estimates
	// from planner statistics; every other count is exact.
	Estimated bool
	// OldestPending is, for every tool with a pending key, how long its
	// oldest due pending key has waited; 0 when none of them is due.
	OldestPending map[string]time.Duration
}

// KeyCounts counts keys per tool and state. A key table of at most
// exactPages pages is counted exactly, in one read of the whole table.
// A larger one is never read whole: the keys pgonce_key_list_idx covers are
// counted exactly from that index, and succeeded keys and tombstones, which
// make up nearly all of a large table, are estimated from the planner's
// statistics (pg_class and pg_stats), which ANALYZE keeps; before the table
// was first analyzed they count as none. The oldest pending key of each tool
// is read from the head of pgonce_key_due_idx. now, when not nil, replaces
// the database's clock.
func (s *Store) KeyCounts(ctx context.Context, now *time.Time, exactPages int64) (*KeyCounts, error) {
	counts := &KeyCounts{}
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		table, err := q.StatsKeyTable(ctx, db)
		if err != nil {
			return err
		}
		if table.Pages <= exactPages {
			rows, err := q.KeyCountByToolAndState(ctx, db)
			for _, row := range rows {
				counts.Counts = append(counts.Counts, &StateCount{Tool: row.Tool, State: row.State, Keys: row.Keys})
			}
			return err
		}
		listed, err := q.StatsKeyCountListed(ctx, db)
		if err != nil {
			return err
		}
		fractions, err := q.StatsToolFractions(ctx, db)
		if err != nil {
			return err
		}
		counts.Estimated = true
		counts.Counts = estimateFinished(table, fractions, listed)
		return nil
	})
	if err != nil {
		return nil, err
	}
	var pending []string
	for _, c := range counts.Counts {
		if c.State == "pending" && c.Keys > 0 {
			pending = append(pending, c.Tool)
		}
	}
	if len(pending) == 0 {
		return counts, nil
	}
	counts.OldestPending = make(map[string]time.Duration, len(pending))
	err = s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		rows, err := q.StatsOldestPendingByTool(ctx, db, &dbpgx.StatsOldestPendingByToolParams{Now: now, Tools: pending})
		for _, row := range rows {
			counts.OldestPending[row.Tool] = time.Duration(row.OldestPendingMs) * time.Millisecond
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return counts, nil
}

// estimateFinished returns the exact counts listed, with estimates of each
// tool's succeeded keys and of the tombstones added. The table holds an
// estimated number of rows; a tool's share of them is its frequency among
// the most common tools, or, for a tool outside them, an even part of what
// the most common tools and the tombstones (the rows without a tool) leave.
// A tool's rows that are not in a listed state are succeeded keys.
func estimateFinished(table *dbpgx.StatsKeyTableRow, fractions []*dbpgx.StatsToolFractionsRow, listed []*dbpgx.StatsKeyCountListedRow) []*StateCount {
	counts := make([]*StateCount, 0, len(listed)+len(fractions)+1)
	listedByTool := map[string]int64{}
	var tools []string
	for _, row := range listed {
		if _, seen := listedByTool[row.Tool]; !seen {
			tools = append(tools, row.Tool)
		}
		listedByTool[row.Tool] += row.Keys
		counts = append(counts, &StateCount{Tool: row.Tool, State: row.State, Keys: row.Keys})
	}
	if !table.Analyzed || table.EstimatedRows <= 0 {
		return counts
	}
	rows := table.EstimatedRows
	common := make(map[string]float64, len(fractions))
	rest := 1 - table.ToolNullFraction
	for _, f := range fractions {
		common[f.Tool] = f.Fraction
		rest -= f.Fraction
		if _, seen := listedByTool[f.Tool]; !seen {
			tools = append(tools, f.Tool)
		}
	}
	// n_distinct is a count when positive, minus a fraction of the rows when
	// negative.
	distinct := table.ToolDistinct
	if distinct < 0 {
		distinct = -distinct * rows
	}
	var perOther float64
	if others := math.Round(distinct) - float64(len(fractions)); others >= 1 && rest > 0 {
		perOther = rest * rows / others
	}
	for _, tool := range tools {
		toolRows := perOther
		if f, ok := common[tool]; ok {
			toolRows = f * rows
		}
		if succeeded := int64(math.Round(toolRows)) - listedByTool[tool]; succeeded > 0 {
			counts = append(counts, &StateCount{Tool: tool, State: string(StateSucceeded), Keys: succeeded})
		}
	}
	if tombstones := int64(math.Round(table.ToolNullFraction * rows)); tombstones > 0 {
		counts = append(counts, &StateCount{State: string(StateExpired), Keys: tombstones})
	}
	return counts
}

// QueueEntry is the queue fields of an open key; zero values stand for
// NULL.
type QueueEntry struct {
	Attempt          int
	AvailableAt      time.Time
	LeaseUntil       time.Time
	Worker           string
	FirstAttemptedAt time.Time
	Ambiguous        bool
	LastError        string
}

// StateCount counts the keys of one tool in one state (pending and
// in_flight for open keys).
type StateCount struct {
	Tool  string
	State string
	Keys  int64
}

// QueueStats summarises the queue.
type QueueStats struct {
	Pending       int64
	InFlight      int64
	ExpiredLeases int64
	OldestPending time.Duration
}

// QueueEntry returns the queue fields of an open key, or [ErrNoRows] for a
// key that is not open.
func (s *Store) QueueEntry(ctx context.Context, key string) (*QueueEntry, error) {
	var entry *QueueEntry
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		row, err := q.OutboxGet(ctx, db, &dbpgx.OutboxGetParams{Key: keyDigest(key)})
		if err != nil {
			return err
		}
		entry = &QueueEntry{
			Attempt:          int(row.Attempt),
			AvailableAt:      row.AvailableAt,
			LeaseUntil:       deref(row.LeaseUntil),
			Worker:           deref(row.Worker),
			FirstAttemptedAt: deref(row.FirstAttemptedAt),
			Ambiguous:        row.Ambiguous,
			LastError:        deref(row.LastError),
		}
		return nil
	})
	return entry, err
}

// CountByToolAndState counts keys per tool and state. It reads the whole
// key table.
func (s *Store) CountByToolAndState(ctx context.Context) ([]*StateCount, error) {
	var counts []*StateCount
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		rows, err := q.KeyCountByToolAndState(ctx, db)
		for _, row := range rows {
			counts = append(counts, &StateCount{Tool: row.Tool, State: row.State, Keys: row.Keys})
		}
		return err
	})
	return counts, err
}

// QueueStats summarises the queue.
func (s *Store) QueueStats(ctx context.Context, now *time.Time) (*QueueStats, error) {
	var stats *QueueStats
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		row, err := q.OutboxStats(ctx, db, &dbpgx.OutboxStatsParams{Now: now})
		if err != nil {
			return err
		}
		stats = &QueueStats{
			Pending:       row.Pending,
			InFlight:      row.InFlight,
			ExpiredLeases: row.ExpiredLeases,
			OldestPending: time.Duration(row.OldestPendingMs) * time.Millisecond,
		}
		return nil
	})
	return stats, err
}
