package store

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgonce/pgonce/internal/dbpgx"
	"github.com/pgonce/pgonce/internal/dbstd"
)

// ErrNotPgxStdlib is returned for a *sql.DB whose driver is not pgx's stdlib
// driver: pgonce needs the pgx connection under database/sql for batches and
// notifications.
var ErrNotPgxStdlib = errors.New("database/sql handle must use the pgx stdlib driver (github.com/jackc/pgx/v5/stdlib)")

// StdDriver serves clients of *sql.Tx over a *sql.DB opened with the pgx
// stdlib driver.
type StdDriver struct {
	store *Store
	db    *sql.DB
}

// NewStdDriver returns a driver over db for schema, a name that
// migrations.ValidateSchema accepted (outbox checks it first).
func NewStdDriver(db *sql.DB, schema string) (*StdDriver, error) {
	if _, ok := db.Driver().(*stdlib.Driver); !ok {
		return nil, ErrNotPgxStdlib
	}
	withConn := func(ctx context.Context, f func(*pgx.Conn) error) error {
		conn, err := db.Conn(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = conn.Close() }()
		return conn.Raw(func(driverConn any) error {
			return f(driverConn.(*stdlib.Conn).Conn()) //nolint:forcetypeassert // checked in NewStdDriver
		})
	}
	store, err := newStore(schema,
		func(ctx context.Context, f func(dbpgx.DBTX) error) error {
			return withConn(ctx, func(conn *pgx.Conn) error { return f(conn) })
		},
		withConn,
		// Read on every use: SetMaxOpenConns may come after New.
		func() int { return db.Stats().MaxOpenConnections },
		versionOf(schema, db),
		func(s *Store) Executor { return newStdExecutor(db, s) },
	)
	if err != nil {
		return nil, err
	}
	return &StdDriver{store: store, db: db}, nil
}

// UnwrapExecutor returns an executor that runs in tx.
func (d *StdDriver) UnwrapExecutor(tx *sql.Tx) Executor { return newStdExecutor(tx, d.store) }

// Store returns the transaction-free operations.
func (d *StdDriver) Store() *Store { return d.store }

// stdTemplated runs statements in the store's schema.
type stdTemplated struct {
	db  dbstd.DBTX
	tpl *template
}

func (s stdTemplated) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return s.db.ExecContext(ctx, s.tpl.fill(query), args...)
}

func (s stdTemplated) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	return s.db.PrepareContext(ctx, s.tpl.fill(query))
}

func (s stdTemplated) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return s.db.QueryContext(ctx, s.tpl.fill(query), args...)
}

func (s stdTemplated) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return s.db.QueryRowContext(ctx, s.tpl.fill(query), args...)
}

type stdExecutor struct {
	db    dbstd.DBTX
	q     *dbstd.Queries
	store *Store
}

func newStdExecutor(db dbstd.DBTX, s *Store) *stdExecutor {
	return &stdExecutor{db: stdTemplated{db: db, tpl: s.template}, q: dbstd.New(), store: s}
}

func (e *stdExecutor) KeyInsert(ctx context.Context, key *NewKey) (*InsertedKey, error) {
	row, err := e.q.KeyInsert(ctx, e.db, (*dbstd.KeyInsertParams)(keyInsertParams(key)))
	if err != nil {
		return nil, e.store.interpretError(ctx, err)
	}
	return insertedKey((*dbpgx.KeyInsertRow)(row)), nil
}

func (e *stdExecutor) KeyInsertMany(ctx context.Context, p *InsertManyParams) ([]*InsertedKey, error) {
	rows, err := e.q.KeyInsertMany(ctx, e.db, (*dbstd.KeyInsertManyParams)(keyInsertManyParams(p)))
	if err != nil {
		return nil, e.store.interpretError(ctx, err)
	}
	converted := make([]*dbpgx.KeyInsertManyRow, len(rows))
	for i, row := range rows {
		converted[i] = (*dbpgx.KeyInsertManyRow)(row)
	}
	return insertedKeys(converted), nil
}

func (e *stdExecutor) KeysByScope(ctx context.Context, scopes []string, now *time.Time) ([]*KeyRow, error) {
	rows, err := e.q.KeyGetByScopes(ctx, e.db, &dbstd.KeyGetByScopesParams{Scopes: strings.Join(scopes, ","), Now: now})
	if err != nil {
		return nil, e.store.interpretError(ctx, err)
	}
	keys := make([]*KeyRow, len(rows))
	for i, row := range rows {
		keys[i] = keyRowFromGet((*dbpgx.KeyGetRow)(row))
	}
	return keys, nil
}

func (e *stdExecutor) KeyCompleteInTx(ctx context.Context, p *CompleteInTxParams) error {
	_, err := e.q.KeyCompleteInTx(ctx, e.db, (*dbstd.KeyCompleteInTxParams)(completeInTxParams(p)))
	return e.store.interpretError(ctx, err)
}

func (e *stdExecutor) KeyGet(ctx context.Context, key string, now *time.Time) (*KeyRow, error) {
	row, err := e.q.KeyGet(ctx, e.db, &dbstd.KeyGetParams{Key: keyDigest(key), Now: now})
	if err != nil {
		return nil, e.store.interpretError(ctx, err)
	}
	return keyRowFromGet((*dbpgx.KeyGetRow)(row)), nil
}

func (e *stdExecutor) KeyGetByKeyOrScope(ctx context.Context, key, scope string, now *time.Time) (*KeyRow, error) {
	row, err := e.q.KeyGetByKeyOrScope(ctx, e.db, &dbstd.KeyGetByKeyOrScopeParams{Key: keyDigest(key), Scope: hexDigest(scope), Now: now})
	if err != nil {
		return nil, e.store.interpretError(ctx, err)
	}
	return keyRowFromGet((*dbpgx.KeyGetRow)(row)), nil
}
