// Package drivertest runs a test once per driver that pgonce supports:
// native pgx ([outbox.NewPgx] over a *pgxpool.Pool) and database/sql
// ([outbox.New] over a *sql.DB opened with pgx's stdlib driver), each
// connected directly to PostgreSQL and, with [All], each through a
// PgBouncer in transaction pooling mode as well. A test written once
// against a [Driver] of transaction type TTx builds its clients, and
// submits in that driver's own transactions, through it.
//
// It lives apart from pgoncetest because it imports outbox, whose internal
// tests import pgoncetest.
package drivertest

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

// Names of the drivers, as subtests and child processes name them.
const (
	NamePgx         = "Pgx"
	NameDatabaseSQL = "DatabaseSQL"
	// NamePgxPgBouncer and NameDatabaseSQLPgBouncer name the drivers
	// through the shared PgBouncer ([PgxPgBouncer], [DatabaseSQLPgBouncer]).
	NamePgxPgBouncer         = "PgxPgBouncer"
	NameDatabaseSQLPgBouncer = "DatabaseSQLPgBouncer"
)

// Driver opens pgonce clients of transaction type TTx over a pgx pool, and
// runs that type's transactions.
type Driver[TTx any] struct {
	// Name names the driver in subtest names: [NamePgx], [NameDatabaseSQL],
	// [NamePgxPgBouncer] or [NameDatabaseSQLPgBouncer].
	Name string
	// Pooled says that the driver's clients and transactions reach
	// PostgreSQL through the shared PgBouncer in transaction pooling mode
	// ([pgoncetest.PooledPool]), with [outbox.PoolingTransaction].
	Pooled bool

	// poolFunc returns the pool that [Driver.Client] and the driver's
	// transactions use, and urlFunc the URL it connects to.
	poolFunc func(tb testing.TB) *pgxpool.Pool
	urlFunc  func(tb testing.TB) string

	// openFunc returns a client over pool, and what closes the handle it
	// made over pool, if any.
	openFunc func(pool *pgxpool.Pool, config outbox.Config) (*outbox.Client[TTx], func(), error)
	// inTxFunc runs fn in a transaction over the shared test database and
	// commits when fn returns nil.
	inTxFunc func(tb testing.TB, ctx context.Context, fn func(tx TTx) error) error
}

// Pgx is the native pgx driver: outbox.NewPgx over the pool itself, and
// pgx.Tx transactions.
func Pgx() Driver[pgx.Tx] {
	return pgxOver(NamePgx, pgoncetest.Pool, pgoncetest.DatabaseURL)
}

// PgxPgBouncer is [Pgx] through the shared PgBouncer in transaction
// pooling mode (see [Driver.Pooled]).
func PgxPgBouncer() Driver[pgx.Tx] {
	return pooled(pgxOver(NamePgxPgBouncer, pgoncetest.PooledPool, pgoncetest.PooledURL))
}

func pgxOver(name string, poolFunc func(tb testing.TB) *pgxpool.Pool, urlFunc func(tb testing.TB) string) Driver[pgx.Tx] {
	return Driver[pgx.Tx]{
		Name:     name,
		poolFunc: poolFunc,
		urlFunc:  urlFunc,
		openFunc: func(pool *pgxpool.Pool, config outbox.Config) (*outbox.Client[pgx.Tx], func(), error) {
			client, err := outbox.NewPgx(pool, config)
			return client, func() {}, err
		},
		inTxFunc: func(tb testing.TB, ctx context.Context, fn func(tx pgx.Tx) error) error {
			return pgx.BeginFunc(ctx, poolFunc(tb), fn)
		},
	}
}

// DatabaseSQL is the database/sql driver: outbox.New over a *sql.DB that
// pgx's stdlib driver opens over the pool, limited to as many open
// connections as the pool, and *sql.Tx transactions.
func DatabaseSQL() Driver[*sql.Tx] {
	return databaseSQLOver(NameDatabaseSQL, pgoncetest.Pool, pgoncetest.DatabaseURL, pgoncetest.DB)
}

// DatabaseSQLPgBouncer is [DatabaseSQL] through the shared PgBouncer in
// transaction pooling mode (see [Driver.Pooled]), with one difference: its
// *sql.DB opens connections of its own, as sql.Open does, configured as
// the pool's are but in pgx's simple protocol
// ([pgoncetest.SimpleProtocolDB]), so that both exec modes that work
// behind a transaction pooler are tested, and database/sql's own
// connection handling with them.
func DatabaseSQLPgBouncer() Driver[*sql.Tx] {
	d := databaseSQLOver(NameDatabaseSQLPgBouncer, pgoncetest.PooledPool, pgoncetest.PooledURL, pgoncetest.PooledDB)
	d.openFunc = func(pool *pgxpool.Pool, config outbox.Config) (*outbox.Client[*sql.Tx], func(), error) {
		db := pgoncetest.SimpleProtocolDB(pool)
		client, err := outbox.New(db, config)
		if err != nil {
			_ = db.Close()
			return nil, nil, err
		}
		return client, func() { _ = db.Close() }, nil
	}
	return pooled(d)
}

func databaseSQLOver(name string, poolFunc func(tb testing.TB) *pgxpool.Pool, urlFunc func(tb testing.TB) string,
	dbFunc func(tb testing.TB) *sql.DB,
) Driver[*sql.Tx] {
	return Driver[*sql.Tx]{
		Name:     name,
		poolFunc: poolFunc,
		urlFunc:  urlFunc,
		openFunc: func(pool *pgxpool.Pool, config outbox.Config) (*outbox.Client[*sql.Tx], func(), error) {
			db := stdlib.OpenDBFromPool(pool)
			db.SetMaxOpenConns(int(pool.Config().MaxConns))
			client, err := outbox.New(db, config)
			if err != nil {
				_ = db.Close()
				return nil, nil, err
			}
			return client, func() { _ = db.Close() }, nil
		},
		inTxFunc: func(tb testing.TB, ctx context.Context, fn func(tx *sql.Tx) error) error {
			tx, err := dbFunc(tb).BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback() }()
			if err := fn(tx); err != nil {
				return err
			}
			return tx.Commit()
		},
	}
}

// pooled makes d a driver through a transaction pooler: its clients get
// [outbox.PoolingTransaction] and, unless the test gives one, a
// ListenConnectFunc that connects directly to the test database, past the
// pooler, as a LISTEN must.
func pooled[TTx any](d Driver[TTx]) Driver[TTx] {
	open := d.openFunc
	d.Pooled = true
	d.openFunc = func(pool *pgxpool.Pool, config outbox.Config) (*outbox.Client[TTx], func(), error) {
		config.Pooling = outbox.PoolingTransaction
		if config.ListenConnectFunc == nil {
			direct, err := directURL()
			if err != nil {
				return nil, nil, err
			}
			config.ListenConnectFunc = func(ctx context.Context) (*pgx.Conn, error) {
				return pgx.Connect(ctx, direct)
			}
		}
		return open(pool, config)
	}
	return d
}

// directURL is the URL of the test database, past any pooler.
func directURL() (string, error) {
	pool, _, err := pgoncetest.Shared()
	if err != nil {
		return "", err
	}
	return pool.Config().ConnString(), nil
}

// Each runs the test once per direct driver, [Pgx] and [DatabaseSQL], as
// parallel subtests named by the driver. The client, Wait, dispatcher and
// reconciler suites use [All]; Each is for the tests among them that
// cannot run through a transaction pooler (a test that kills its own
// backends, holds session state, or brings a pool of its own), and for
// the suites of other packages. Pass the two instances of one generic test
// function:
//
//	drivertest.Each(t, testDispatcher[pgx.Tx], testDispatcher[*sql.Tx])
func Each(t *testing.T, pgxTest func(*testing.T, Driver[pgx.Tx]), stdTest func(*testing.T, Driver[*sql.Tx])) {
	t.Helper()
	run(t, pgxTest, stdTest, Pgx(), DatabaseSQL())
}

// All is [Each] over the direct drivers and through the shared PgBouncer
// in transaction pooling mode: [Pgx], [DatabaseSQL], [PgxPgBouncer] and
// [DatabaseSQLPgBouncer].
func All(t *testing.T, pgxTest func(*testing.T, Driver[pgx.Tx]), stdTest func(*testing.T, Driver[*sql.Tx])) {
	t.Helper()
	run(t, pgxTest, stdTest, Pgx(), DatabaseSQL())
	run(t, pgxTest, stdTest, PgxPgBouncer(), DatabaseSQLPgBouncer())
}

func run(t *testing.T, pgxTest func(*testing.T, Driver[pgx.Tx]), stdTest func(*testing.T, Driver[*sql.Tx]), pgxDriver Driver[pgx.Tx], stdDriver Driver[*sql.Tx]) {
	t.Helper()
	t.Run(pgxDriver.Name, func(t *testing.T) {
		t.Parallel()
		pgxTest(t, pgxDriver)
	})
	t.Run(stdDriver.Name, func(t *testing.T) {
		t.Parallel()
		stdTest(t, stdDriver)
	})
}

// RunChild runs the body of a test's child process over the driver named
// name ([NamePgx], [NameDatabaseSQL], [NamePgxPgBouncer] or
// [NameDatabaseSQLPgBouncer]): the instance of a generic body for that
// driver, given the driver. The body opens its own pool, over the
// [Driver.URL] its parent passed it. It returns the body's exit code, or
// says on stderr that name is no driver and returns 1.
func RunChild(name string, pgxMain func(Driver[pgx.Tx]) int, stdMain func(Driver[*sql.Tx]) int) int {
	switch name {
	case NamePgx:
		return pgxMain(Pgx())
	case NameDatabaseSQL:
		return stdMain(DatabaseSQL())
	case NamePgxPgBouncer:
		return pgxMain(PgxPgBouncer())
	case NameDatabaseSQLPgBouncer:
		return stdMain(DatabaseSQLPgBouncer())
	}
	fmt.Fprintf(os.Stderr, "child: unknown driver %q: want %q, %q, %q or %q\n", name,
		NamePgx, NameDatabaseSQL, NamePgxPgBouncer, NameDatabaseSQLPgBouncer)
	return 1
}

// URL returns the URL of the test database as the driver reaches it:
// [pgoncetest.DatabaseURL], or [pgoncetest.PooledURL] through the shared
// PgBouncer for a [Driver.Pooled] driver. A child process of the test
// opens its pool over it.
func (d Driver[TTx]) URL(tb testing.TB) string {
	tb.Helper()
	return d.urlFunc(tb)
}

// Client returns a client over the shared test database: directly, or
// through the shared PgBouncer for a [Driver.Pooled] driver.
func (d Driver[TTx]) Client(tb testing.TB, config outbox.Config) *outbox.Client[TTx] {
	tb.Helper()
	return d.ClientOver(tb, d.poolFunc(tb), config)
}

// Pool returns the pool the driver's clients and transactions use:
// [pgoncetest.Pool], or [pgoncetest.PooledPool] for a [Driver.Pooled]
// driver.
func (d Driver[TTx]) Pool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	return d.poolFunc(tb)
}

// ClientOver returns a client over pool (a pool of the test's own: a
// killable one, one behind a proxy, one with a shifted clock). The handle
// it opens over pool closes when tb ends; the pool stays its owner's. A
// config without a Logger gets [pgoncetest.Logger]: what the client, and
// the dispatchers and reconcilers over it, log goes to tb's log.
func (d Driver[TTx]) ClientOver(tb testing.TB, pool *pgxpool.Pool, config outbox.Config) *outbox.Client[TTx] {
	tb.Helper()
	if config.Logger == nil {
		config.Logger = pgoncetest.Logger(tb)
	}
	client, closeFunc, err := d.openFunc(pool, config)
	require.NoError(tb, err, "open a %s client", d.Name)
	tb.Cleanup(closeFunc)
	return client
}

// Open returns a client over pool and a function that closes the handle
// it opened over pool, for code that runs without a testing.TB (a child
// process of a test).
func (d Driver[TTx]) Open(pool *pgxpool.Pool, config outbox.Config) (client *outbox.Client[TTx], closeFunc func(), err error) {
	return d.openFunc(pool, config)
}

// SubmitAll submits calls through client in one transaction of the driver
// over the shared test database, committed before it returns, and returns
// their results in order. It fails tb unless every call created its key:
// set up many keys at the cost of one commit.
func (d Driver[TTx]) SubmitAll(tb testing.TB, client *outbox.Client[TTx], calls []outbox.Call) []outbox.Result {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	results := make([]outbox.Result, len(calls))
	err := d.inTxFunc(tb, ctx, func(tx TTx) error {
		for i, call := range calls {
			res, err := client.SubmitTx(ctx, tx, call)
			if err != nil {
				return fmt.Errorf("submit call %d (%s step %d): %w", i, call.Tool, call.Step, err)
			}
			if !res.Created {
				return fmt.Errorf("submit call %d (%s step %d): key %s existed already", i, call.Tool, call.Step, res.Key)
			}
			results[i] = res
		}
		return nil
	})
	require.NoError(tb, err, "submit %d calls in one %s transaction", len(calls), d.Name)
	return results
}

// SubmitKeys is [Driver.SubmitAll] that returns the keys alone.
func (d Driver[TTx]) SubmitKeys(tb testing.TB, client *outbox.Client[TTx], calls []outbox.Call) []outbox.Key {
	tb.Helper()
	results := d.SubmitAll(tb, client, calls)
	keys := make([]outbox.Key, len(results))
	for i, res := range results {
		keys[i] = res.Key
	}
	return keys
}

// InTx runs fn in a transaction of the driver over the shared test
// database, committed when fn returns nil and rolled back otherwise, and
// returns fn's error or the commit's.
func (d Driver[TTx]) InTx(tb testing.TB, ctx context.Context, fn func(tx TTx) error) error {
	tb.Helper()
	return d.inTxFunc(tb, ctx, fn)
}
