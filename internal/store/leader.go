package store

import (
	"context"
	"errors"
	"time"

	"github.com/pgonce/pgonce/internal/dbpgx"
)

// Leadership says who holds a leadership, and until when.
type Leadership struct {
	LeaderID  string
	ElectedAt time.Time
	ExpiresAt time.Time
	// Live is false for a lease that expired: anyone may take over.
	Live bool
}

// LeaderElect makes leaderID the holder of leadership name for ttl: it takes
// a free or expired leadership and renews one leaderID holds. It reports
// whether leaderID holds the leadership now.
func (s *Store) LeaderElect(ctx context.Context, name, leaderID string, ttl time.Duration, now *time.Time) (bool, error) {
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		_, err := q.LeaderElect(ctx, db, &dbpgx.LeaderElectParams{
			Name:     name,
			LeaderID: leaderID,
			Now:      now,
			TtlMs:    ttl.Milliseconds(),
		})
		return err
	})
	if errors.Is(err, ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// LeaderResign gives leadership name up if leaderID holds it, and reports
// whether it did.
func (s *Store) LeaderResign(ctx context.Context, name, leaderID string) (bool, error) {
	var deleted int64
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		var err error
		deleted, err = q.LeaderResign(ctx, db, &dbpgx.LeaderResignParams{Name: name, LeaderID: leaderID})
		return err
	})
	return deleted > 0, err
}

// LeaderGet reads leadership name, or returns [ErrNoRows] when nobody holds
// it.
func (s *Store) LeaderGet(ctx context.Context, name string, now *time.Time) (*Leadership, error) {
	var leadership *Leadership
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		row, err := q.LeaderGet(ctx, db, &dbpgx.LeaderGetParams{Name: name, Now: now})
		if err != nil {
			return err
		}
		leadership = &Leadership{LeaderID: row.LeaderID, ElectedAt: row.ElectedAt, ExpiresAt: row.ExpiresAt, Live: row.Live}
		return nil
	})
	return leadership, err
}
