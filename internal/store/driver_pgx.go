package store

import (
	"context"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgonce/pgonce/internal/dbpgx"
)

// PgxDriver serves clients of pgx.Tx over a *pgxpool.Pool.
type PgxDriver struct {
	store *Store
	pool  *pgxpool.Pool
}

// NewPgxDriver returns a driver over pool for schema, a name that
// migrations.ValidateSchema accepted (outbox checks it first).
func NewPgxDriver(pool *pgxpool.Pool, schema string) (*PgxDriver, error) {
	store, err := newStore(schema,
		func(ctx context.Context, f func(dbpgx.DBTX) error) error { return f(pool) },
		func(ctx context.Context, f func(*pgx.Conn) error) error {
			return pool.AcquireFunc(ctx, func(conn *pgxpool.Conn) error { return f(conn.Conn()) })
		},
		func() int { return int(pool.Stat().MaxConns()) },
		func(ctx context.Context) (int64, int64, error) {
			// Closing this *sql.DB releases its connections to pool and
			// leaves pool open.
			db := stdlib.OpenDBFromPool(pool)
			defer func() { _ = db.Close() }()
			return versionOf(schema, db)(ctx)
		},
		func(s *Store) Executor { return newPgxExecutor(pool, s) },
	)
	if err != nil {
		return nil, err
	}
	return &PgxDriver{store: store, pool: pool}, nil
}

// UnwrapExecutor returns an executor that runs in tx.
func (d *PgxDriver) UnwrapExecutor(tx pgx.Tx) Executor { return newPgxExecutor(tx, d.store) }

// Store returns the transaction-free operations.
func (d *PgxDriver) Store() *Store { return d.store }

type pgxExecutor struct {
	db    dbpgx.DBTX
	q     *dbpgx.Queries
	store *Store
}

func newPgxExecutor(db dbpgx.DBTX, s *Store) *pgxExecutor {
	return &pgxExecutor{db: pgxTemplated{db: db, tpl: s.template}, q: dbpgx.New(), store: s}
}

func (e *pgxExecutor) KeyInsert(ctx context.Context, key *NewKey) (*InsertedKey, error) {
	row, err := e.q.KeyInsert(ctx, e.db, keyInsertParams(key))
	if err != nil {
		return nil, e.store.interpretError(ctx, err)
	}
	return insertedKey(row), nil
}

func (e *pgxExecutor) KeyInsertMany(ctx context.Context, p *InsertManyParams) ([]*InsertedKey, error) {
	rows, err := e.q.KeyInsertMany(ctx, e.db, keyInsertManyParams(p))
	if err != nil {
		return nil, e.store.interpretError(ctx, err)
	}
	return insertedKeys(rows), nil
}

func (e *pgxExecutor) KeysByScope(ctx context.Context, scopes []string, now *time.Time) ([]*KeyRow, error) {
	rows, err := e.q.KeyGetByScopes(ctx, e.db, &dbpgx.KeyGetByScopesParams{Scopes: strings.Join(scopes, ","), Now: now})
	if err != nil {
		return nil, e.store.interpretError(ctx, err)
	}
	keys := make([]*KeyRow, len(rows))
	for i, row := range rows {
		keys[i] = keyRowFromGet((*dbpgx.KeyGetRow)(row))
	}
	return keys, nil
}

func (e *pgxExecutor) KeyCompleteInTx(ctx context.Context, p *CompleteInTxParams) error {
	_, err := e.q.KeyCompleteInTx(ctx, e.db, completeInTxParams(p))
	return e.store.interpretError(ctx, err)
}

func (e *pgxExecutor) KeyGet(ctx context.Context, key string, now *time.Time) (*KeyRow, error) {
	row, err := e.q.KeyGet(ctx, e.db, &dbpgx.KeyGetParams{Key: keyDigest(key), Now: now})
	if err != nil {
		return nil, e.store.interpretError(ctx, err)
	}
	return keyRowFromGet(row), nil
}

func (e *pgxExecutor) KeyGetByKeyOrScope(ctx context.Context, key, scope string, now *time.Time) (*KeyRow, error) {
	row, err := e.q.KeyGetByKeyOrScope(ctx, e.db, &dbpgx.KeyGetByKeyOrScopeParams{Key: keyDigest(key), Scope: hexDigest(scope), Now: now})
	if err != nil {
		return nil, e.store.interpretError(ctx, err)
	}
	return keyRowFromGet((*dbpgx.KeyGetRow)(row)), nil
}
