package store

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgonce/pgonce/internal/dbpgx"
)

// PgxDriver serves clients of pgx.Tx over a *pgxpool.Pool.
type PgxDriver struct {
	store *Store
}

// NewPgxDriver returns a driver over pool for schema.
func NewPgxDriver(pool *pgxpool.Pool, schema string) (*PgxDriver, error) {
	store, err := newStore(schema,
		func(ctx context.Context, f func(dbpgx.DBTX) error) error { return f(pool) },
		func(ctx context.Context, f func(*pgx.Conn) error) error {
			return pool.AcquireFunc(ctx, func(conn *pgxpool.Conn) error { return f(conn.Conn()) })
		},
		func() int { return int(pool.Stat().MaxConns()) },
		func(rw *rewriter) Executor { return newPgxExecutor(pool, rw) },
	)
	if err != nil {
		return nil, err
	}
	return &PgxDriver{store: store}, nil
}

// UnwrapExecutor returns an executor that runs in tx.
func (d *PgxDriver) UnwrapExecutor(tx pgx.Tx) Executor { return newPgxExecutor(tx, d.store.rewriter) }

// Store returns the transaction-free operations.
func (d *PgxDriver) Store() *Store { return d.store }

type pgxExecutor struct {
	db dbpgx.DBTX
	q  *dbpgx.Queries
}

func newPgxExecutor(db dbpgx.DBTX, rw *rewriter) *pgxExecutor {
	return &pgxExecutor{db: pgxRewriting{db: db, rw: rw}, q: dbpgx.New()}
}

func (e *pgxExecutor) KeyInsert(ctx context.Context, params *dbpgx.KeyInsertParams) (*dbpgx.KeyInsertRow, error) {
	row, err := e.q.KeyInsert(ctx, e.db, params)
	return row, InterpretErrorContext(ctx, err)
}

func (e *pgxExecutor) KeyGet(ctx context.Context, params *dbpgx.KeyGetParams) (*dbpgx.KeyGetRow, error) {
	row, err := e.q.KeyGet(ctx, e.db, params)
	return row, InterpretErrorContext(ctx, err)
}

func (e *pgxExecutor) KeyGetByKeyOrScope(ctx context.Context, params *dbpgx.KeyGetByKeyOrScopeParams) (*dbpgx.KeyGetRow, error) {
	row, err := e.q.KeyGetByKeyOrScope(ctx, e.db, params)
	return (*dbpgx.KeyGetRow)(row), InterpretErrorContext(ctx, err)
}
