package store

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgonce/pgonce/internal/dbpgx"
	"github.com/pgonce/pgonce/internal/dbstd"
)

// FinishInTxParams is the outcome [Executor.KeyFinishInTx] records.
type FinishInTxParams struct {
	Key   string
	Scope string
	// Attempt fences the write: only a key open under a lease at this
	// attempt is written.
	Attempt int
	// State is StateSucceeded or StateFailed, with Response or Failure.
	State              State
	Response           []byte
	Failure            []byte
	Retention          time.Duration
	TombstoneRetention time.Duration
	// Channel, when not empty, is notified with the key once the
	// transaction commits.
	Channel string
	Now     *time.Time
}

func finishInTxParams(p *FinishInTxParams) *dbstd.KeyFinishInTxParams {
	return &dbstd.KeyFinishInTxParams{
		Channel:     p.Channel,
		State:       string(p.State),
		Response:    p.Response,
		Failure:     p.Failure,
		Now:         p.Now,
		RetentionMs: p.Retention.Milliseconds(),
		TombstoneMs: p.TombstoneRetention.Milliseconds(),
		Scope:       hexDigest(p.Scope),
		Key:         keyDigest(p.Key),
		Attempt:     int32(p.Attempt), //nolint:gosec // attempts stay small
	}
}

func (e *pgxExecutor) KeyFinishInTx(ctx context.Context, p *FinishInTxParams) (bool, error) {
	_, err := e.q.KeyFinishInTx(ctx, e.db, (*dbpgx.KeyFinishInTxParams)(finishInTxParams(p)))
	return finishedInTx(ctx, e.store, err)
}

func (e *stdExecutor) KeyFinishInTx(ctx context.Context, p *FinishInTxParams) (bool, error) {
	_, err := e.q.KeyFinishInTx(ctx, e.db, finishInTxParams(p))
	return finishedInTx(ctx, e.store, err)
}

// finishedInTx reads KeyFinishInTx's answer: no row is a fenced-out
// attempt, not an error.
func finishedInTx(ctx context.Context, s *Store, err error) (bool, error) {
	err = s.interpretError(ctx, err)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, ErrNoRows):
		return false, nil
	}
	return false, err
}

// ReadBack is where a key stands, as [Store.KeyReadBack] reads it.
type ReadBack struct {
	// State is the stored state: StateOpen for a pending or in-flight key.
	State   State
	Attempt int
	// Leased reports a key in flight.
	Leased bool
}

// KeyReadBack reads where key stands once no transaction holds its row any
// more: it waits for one that does (a COMMIT whose reply was lost, still
// running or not yet rolled back on the server), so that what it reads is
// that transaction's result. It returns [ErrNoRows] for an unknown key.
func (s *Store) KeyReadBack(ctx context.Context, key string) (*ReadBack, error) {
	var back *ReadBack
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		row, err := q.KeyReadBack(ctx, db, &dbpgx.KeyReadBackParams{Key: keyDigest(key)})
		if err != nil {
			return err
		}
		back = &ReadBack{State: State(row.State), Attempt: int(row.Attempt), Leased: row.Leased}
		return nil
	})
	return back, err
}

// Begin opens a transaction on the driver's pool.
func (d *PgxDriver) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := d.pool.Begin(ctx)
	return tx, d.store.interpretError(ctx, err)
}

// Commit commits tx.
func (d *PgxDriver) Commit(ctx context.Context, tx pgx.Tx) error {
	return d.store.interpretError(ctx, tx.Commit(ctx))
}

// Rollback rolls tx back.
func (d *PgxDriver) Rollback(ctx context.Context, tx pgx.Tx) error {
	return d.store.interpretError(ctx, tx.Rollback(ctx))
}

// Begin opens a transaction on the driver's database. It is not bound to
// ctx: database/sql would roll it back when ctx ends, and the caller
// decides when it ends.
func (d *StdDriver) Begin(ctx context.Context) (*sql.Tx, error) {
	tx, err := d.db.BeginTx(context.WithoutCancel(ctx), nil)
	return tx, d.store.interpretError(ctx, err)
}

// Commit commits tx.
func (d *StdDriver) Commit(ctx context.Context, tx *sql.Tx) error {
	return d.store.interpretError(ctx, tx.Commit())
}

// Rollback rolls tx back.
func (d *StdDriver) Rollback(ctx context.Context, tx *sql.Tx) error {
	return d.store.interpretError(ctx, tx.Rollback())
}
