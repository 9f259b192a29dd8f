package store

import (
	"context"
	"time"

	"github.com/pgonce/pgonce/internal/dbpgx"
)

// ToolCount counts keys of one tool.
type ToolCount struct {
	Tool  string
	Count int64
	// Oldest is the creation time of the oldest key counted, where the
	// operation says so.
	Oldest time.Time
}

// CountUnservedParams are the parameters of [Store.CountUnserved].
type CountUnservedParams struct {
	Tools []string
	Age   time.Duration
	Now   *time.Time
}

// CountExpiredParams are the parameters of [Store.CountExpired].
type CountExpiredParams struct {
	Tools []string
	Grace time.Duration
	Now   *time.Time
}

// StalePending counts pending keys due for too long.
type StalePending struct {
	Count     int64
	OldestAge time.Duration
}

// CountUnserved counts, per tool, pending keys of tools outside Tools that
// were created more than Age ago; Oldest is the oldest one's creation.
func (s *Store) CountUnserved(ctx context.Context, p *CountUnservedParams) ([]*ToolCount, error) {
	var counts []*ToolCount
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		rows, err := q.OutboxCountUnserved(ctx, db, &dbpgx.OutboxCountUnservedParams{
			Tools: p.Tools,
			Now:   p.Now,
			AgeMs: p.Age.Milliseconds(),
		})
		for _, row := range rows {
			counts = append(counts, &ToolCount{Tool: row.Tool, Count: row.Waiting, Oldest: row.Oldest})
		}
		return err
	})
	return counts, err
}

// CountExpired counts, per tool, in-flight keys past lease and Grace of
// tools outside Tools.
func (s *Store) CountExpired(ctx context.Context, p *CountExpiredParams) ([]*ToolCount, error) {
	var counts []*ToolCount
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		rows, err := q.OutboxCountExpired(ctx, db, &dbpgx.OutboxCountExpiredParams{
			Now:     p.Now,
			GraceMs: p.Grace.Milliseconds(),
			Tools:   p.Tools,
		})
		for _, row := range rows {
			counts = append(counts, &ToolCount{Tool: row.Tool, Count: row.Expired})
		}
		return err
	})
	return counts, err
}

// CountStalePending counts pending keys due for longer than age.
func (s *Store) CountStalePending(ctx context.Context, age time.Duration, now *time.Time) (*StalePending, error) {
	var stale *StalePending
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		row, err := q.OutboxCountStalePending(ctx, db, &dbpgx.OutboxCountStalePendingParams{
			Now:   now,
			AgeMs: age.Milliseconds(),
		})
		if err != nil {
			return err
		}
		stale = &StalePending{Count: row.Stale, OldestAge: time.Duration(row.OldestAgeMs) * time.Millisecond}
		return nil
	})
	return stale, err
}

// Expire turns up to max finished keys past their retention into
// tombstones and returns how many it turned.
func (s *Store) Expire(ctx context.Context, max int, now *time.Time) (int64, error) {
	return runInt64(ctx, s, func(q *dbpgx.Queries, db dbpgx.DBTX) (int64, error) {
		return q.KeyExpire(ctx, db, &dbpgx.KeyExpireParams{
			Now:     now,
			MaxRows: int32(max), //nolint:gosec // the caller bounds it to int32
		})
	})
}

// Forget deletes up to max tombstones past their horizon and returns how
// many it deleted.
func (s *Store) Forget(ctx context.Context, max int, now *time.Time) (int64, error) {
	return runInt64(ctx, s, func(q *dbpgx.Queries, db dbpgx.DBTX) (int64, error) {
		return q.KeyForget(ctx, db, &dbpgx.KeyForgetParams{
			Now:     now,
			MaxRows: int32(max), //nolint:gosec // the caller bounds it to int32
		})
	})
}

// CountExpirable counts the finished keys past their retention.
func (s *Store) CountExpirable(ctx context.Context, now *time.Time) (int64, error) {
	return runInt64(ctx, s, func(q *dbpgx.Queries, db dbpgx.DBTX) (int64, error) {
		return q.KeyCountExpirable(ctx, db, &dbpgx.KeyCountExpirableParams{Now: now})
	})
}

// CountForgettable counts the tombstones past their horizon.
func (s *Store) CountForgettable(ctx context.Context, now *time.Time) (int64, error) {
	return runInt64(ctx, s, func(q *dbpgx.Queries, db dbpgx.DBTX) (int64, error) {
		return q.KeyCountForgettable(ctx, db, &dbpgx.KeyCountForgettableParams{Now: now})
	})
}
