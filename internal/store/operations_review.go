package store

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgonce/pgonce/internal/dbpgx"
)

// ResolveParams are the parameters of [Store.Resolve].
type ResolveParams struct {
	Key string
	// Action is "succeeded", "failed" or "retry".
	Action             string
	Response           []byte
	Failure            []byte
	Retention          time.Duration
	TombstoneRetention time.Duration
	ResolvedBy         string
	Reason             string
	Channel            string
	Now                *time.Time
}

// Resolution is one recorded operator decision.
type Resolution struct {
	Action     string
	ResolvedBy string
	Reason     string
	ResolvedAt time.Time
}

// Resolve applies an operator decision to a key in needs_review and records
// it. It returns [ErrNoRows] when the key is in any other state.
func (s *Store) Resolve(ctx context.Context, p *ResolveParams) error {
	return s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		_, err := q.KeyResolve(ctx, db, &dbpgx.KeyResolveParams{
			Action:      p.Action,
			Key:         keyDigest(p.Key),
			Response:    p.Response,
			Failure:     p.Failure,
			Now:         p.Now,
			RetentionMs: p.Retention.Milliseconds(),
			TombstoneMs: p.TombstoneRetention.Milliseconds(),
			ResolvedBy:  p.ResolvedBy,
			Reason:      p.Reason,
			Channel:     p.Channel,
		})
		return err
	})
}

// SettleReviewParams are the parameters of [Store.SettleReview].
type SettleReviewParams struct {
	// Outcome is the late outcome: its key, the attempt whose provider
	// answered, and a State of StateSucceeded or StateFailed.
	Outcome Outcome
	// ReviewReason is the error the reconciler's review gave.
	ReviewReason       string
	TombstoneRetention time.Duration
	// ResolvedBy and Reason are recorded with the settlement.
	ResolvedBy string
	Reason     string
	// Channel, when not empty, is notified with the settled key.
	Channel string
	Now     *time.Time
}

// SettleReview records p.Outcome, fenced out by the reconciler's takeover
// of its attempt, on a key the reconciler sent to review for want of it (or
// holds still, undecided), and records the settlement; see KeySettleReview
// in queries/resolution.sql. It reports whether the key was settled: false
// leaves any other key as it was.
func (s *Store) SettleReview(ctx context.Context, p *SettleReviewParams) (bool, error) {
	var settled bool
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		_, err := q.KeySettleReview(ctx, db, &dbpgx.KeySettleReviewParams{
			State:        string(p.Outcome.State),
			Response:     p.Outcome.Response,
			Failure:      p.Outcome.Failure,
			LastError:    p.Outcome.LastError,
			Now:          p.Now,
			RetentionMs:  p.Outcome.Retention.Milliseconds(),
			TombstoneMs:  p.TombstoneRetention.Milliseconds(),
			Key:          keyDigest(p.Outcome.Key),
			Attempt:      int32(p.Outcome.Attempt), //nolint:gosec // attempts stay small
			ReviewReason: p.ReviewReason,
			ResolvedBy:   p.ResolvedBy,
			Reason:       p.Reason,
			Channel:      p.Channel,
		})
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		settled = err == nil
		return err
	})
	return settled, err
}

// ResolutionsByKey returns the recorded decisions on key, oldest first.
func (s *Store) ResolutionsByKey(ctx context.Context, key string) ([]*Resolution, error) {
	var resolutions []*Resolution
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		rows, err := q.ResolutionListByKey(ctx, db, &dbpgx.ResolutionListByKeyParams{Key: keyDigest(key)})
		for _, row := range rows {
			resolutions = append(resolutions, &Resolution{
				Action: row.Action, ResolvedBy: row.ResolvedBy, Reason: row.Reason, ResolvedAt: row.ResolvedAt,
			})
		}
		return err
	})
	return resolutions, err
}
