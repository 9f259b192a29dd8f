package store

import (
	"context"
	"time"

	"github.com/pgonce/pgonce/internal/dbpgx"
)

// AttemptRecord is one attempt kept in pgonce_attempt.
type AttemptRecord struct {
	Attempt   int
	StartedAt time.Time
	EndedAt   time.Time
	Outcome   string
	Worker    string
	Error     string
}

// Attempts reads the attempts kept of key, in attempt order.
func (s *Store) Attempts(ctx context.Context, key string) ([]AttemptRecord, error) {
	var attempts []AttemptRecord
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		rows, err := q.AttemptListByKey(ctx, db, &dbpgx.AttemptListByKeyParams{Key: keyDigest(key)})
		for _, row := range rows {
			attempts = append(attempts, AttemptRecord{
				Attempt: int(row.Attempt), StartedAt: row.StartedAt, EndedAt: row.EndedAt,
				Outcome: row.Outcome, Worker: deref(row.Worker), Error: deref(row.Error),
			})
		}
		return err
	})
	return attempts, err
}
