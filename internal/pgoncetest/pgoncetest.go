// Package pgoncetest is pgonce's test harness: a real PostgreSQL for every
// test, and a freshly migrated schema per test so that tests run in parallel.
//
// The database is found in this order: PGONCE_TEST_DATABASE_URL; else the
// local default URL; else, when a Docker engine answers, one testcontainers-go
// PostgreSQL per test binary, started on first use. With none of these a test
// fails at once and says how to provide a database; it never skips.
package pgoncetest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
	"go.uber.org/goleak"

	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/store"
	"github.com/pgonce/pgonce/migrations"
)

// DatabaseURLEnv names the variable that points the tests at a database.
const DatabaseURLEnv = "PGONCE_TEST_DATABASE_URL"

// DatabaseURLDefault is the database the tests use when DatabaseURLEnv is
// unset.
const DatabaseURLDefault = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

var shared struct {
	once      sync.Once
	url       string
	err       error
	pool      *pgxpool.Pool
	db        *sql.DB
	container testcontainers.Container
}

// DatabaseURL returns the URL of the test database, starting a container if
// the configured server cannot be reached and Docker can. It fails tb when no
// database can be had.
func DatabaseURL(tb testing.TB) string {
	tb.Helper()
	setup()
	if shared.err != nil {
		tb.Fatal(shared.err)
	}
	return shared.url
}

// Pool returns the pgx pool shared by the tests of this binary. Its
// connections have an empty search_path, so a statement that forgets to
// name its schema fails instead of finding another test's tables.
func Pool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	DatabaseURL(tb)
	return shared.pool
}

// DB returns a *sql.DB over [Pool], for the database/sql paths.
func DB(tb testing.TB) *sql.DB {
	tb.Helper()
	DatabaseURL(tb)
	return shared.db
}

// Shared returns [Pool] and [DB] without a testing.TB, for examples: the
// same database search, the same fallback to a container. [Main] closes
// them when the test binary ends.
func Shared() (*pgxpool.Pool, *sql.DB, error) {
	setup()
	return shared.pool, shared.db, shared.err
}

// Schema creates a schema unique to tb, migrates it, and drops it with all
// its rows when tb ends, after checking every key row against the store's
// invariants (see RequireKeyInvariants).
func Schema(tb testing.TB) string {
	tb.Helper()
	db := DB(tb)
	schema := NewSchemaName(tb)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := migrations.Up(ctx, db, schema); err != nil {
		tb.Fatalf("migrate test schema %s: %v", schema, err)
	}
	tb.Cleanup(func() {
		RequireKeyInvariants(tb, schema)
		DropSchema(tb, schema)
	})
	return schema
}

// keyInvariants is the CHECK constraint of pgonce_key, as the catalog
// prints it: the row invariants the migration states and the database
// enforces, all in one function of the row (see the migration).
const keyInvariants = "CHECK (%s.pgonce_key_invariants(pgonce_key.*))"

// RequireKeyInvariants fails tb unless the row invariants of pgonce_key in
// schema are its one validated CHECK constraint, and every row keeps them (a
// row written before the constraint was dropped and added back NOT VALID
// would not). It names the first broken row and its invariant.
func RequireKeyInvariants(tb testing.TB, schema string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	table := ident.Quote(schema) + ".pgonce_key"
	checks, err := queryStrings(ctx, `SELECT pg_get_constraintdef(oid) FROM pg_constraint
		WHERE conrelid = '`+table+`'::regclass AND contype = 'c' AND convalidated ORDER BY conname`)
	if err != nil {
		tb.Errorf("read key constraints in %s: %v", schema, err)
		return
	}
	// The catalog quotes the schema only where it must.
	printed, err := queryStrings(ctx, `SELECT quote_ident('`+schema+`')`)
	if err != nil {
		tb.Errorf("read key constraints in %s: %v", schema, err)
		return
	}
	if want := fmt.Sprintf(keyInvariants, printed[0]); !slices.Equal(checks, []string{want}) {
		tb.Errorf("validated CHECK constraints of %s: %q, want %q", table, checks, want)
		return
	}
	// The function raises on the first row that breaks an invariant, with
	// the row's key and the invariant's name.
	if _, err := queryStrings(ctx, `SELECT encode(key, 'hex') FROM `+table+`
		WHERE NOT `+ident.Quote(schema)+`.pgonce_key_invariants(pgonce_key)`); err != nil {
		tb.Errorf("key rows in %s break the store's invariants: %v", schema, err)
	}
}

func queryStrings(ctx context.Context, query string) ([]string, error) {
	rows, err := shared.pool.Query(ctx, query)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// NewSchemaName returns a fresh schema name that no other test uses. The
// schema is not created.
func NewSchemaName(tb testing.TB) string {
	tb.Helper()
	var suffix [6]byte
	_, _ = rand.Read(suffix[:])
	return "pgonce_test_" + hex.EncodeToString(suffix[:])
}

// DropSchema drops schema and everything in it.
func DropSchema(tb testing.TB, schema string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := shared.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+ident.Quote(schema)+" CASCADE"); err != nil {
		tb.Errorf("drop test schema %s: %v", schema, err)
	}
}

// Main runs the tests of a package that uses the harness, releases the
// shared database and container, and then checks that no goroutine leaked.
// While the tests run, slog's default logger discards what it is given:
// a test that wants its logs passes [Logger], which writes them to the
// test's log, and the clients of package drivertest get one; the rest
// (deliberate panics' stacks, a killed connection's errors) would bury
// the one failure among them.
func Main(m *testing.M) { MainThen(m, nil) }

// MainThen is [Main] that calls then, when not nil, with the exit code of the
// tests before anything is released, and exits with the code then returns.
func MainThen(m *testing.M, then func(code int) int) {
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	code := m.Run()
	if then != nil {
		code = then(code)
	}
	closePooled()
	if shared.db != nil {
		_ = shared.db.Close()
	}
	if shared.pool != nil {
		shared.pool.Close()
	}
	if shared.container != nil {
		_ = shared.container.Terminate(context.Background())
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: goroutines leaked after a passing run:\n%v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

func setup() {
	shared.once.Do(func() {
		ctx := context.Background()
		url := os.Getenv(DatabaseURLEnv)
		if url == "" {
			url = DatabaseURLDefault
		}
		pool, localErr := connect(ctx, url, FirstConnectBudget)
		var slow *ServerSlowError
		if errors.As(localErr, &slow) {
			// A server is there: a container would only hide it.
			shared.err = fmt.Errorf("no PostgreSQL for the tests: %w.\n"+
				"Wait until the machine is less busy, or set %s to another database", localErr, DatabaseURLEnv)
			return
		}
		if localErr != nil {
			ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()
			containerURL, containerErr := startContainer(ctx)
			if containerErr != nil {
				shared.err = fmt.Errorf("no PostgreSQL for the tests.\n"+
					"  %s: %v\n  testcontainers: %v\n"+
					"Start a local server (e.g. `pg_ctlcluster 15 main start`), set %s to a database "+
					"the tests may create schemas in, or start a Docker engine", url, localErr, containerErr, DatabaseURLEnv)
				return
			}
			url = containerURL
			if pool, shared.err = connect(ctx, url, FirstConnectBudget); shared.err != nil {
				return
			}
		}
		shared.url, shared.pool, shared.db = url, pool, stdlib.OpenDBFromPool(pool)
	})
}

func startContainer(ctx context.Context) (url string, err error) {
	defer func() {
		// Older Docker client paths panic when no engine is found.
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	container, err := testcontainers.Run(ctx, "postgres:16-alpine",
		testcontainers.WithExposedPorts("5432/tcp"),
		testcontainers.WithEnv(map[string]string{"POSTGRES_HOST_AUTH_METHOD": "trust"}),
		testcontainers.WithWaitStrategy(
			wait.ForLog("database system is ready to accept connections").WithOccurrence(2)),
	)
	if err != nil {
		if container != nil {
			_ = container.Terminate(context.WithoutCancel(ctx))
		}
		return "", err
	}
	endpoint, err := container.PortEndpoint(ctx, "5432/tcp", "")
	if err != nil {
		_ = container.Terminate(context.WithoutCancel(ctx))
		return "", err
	}
	if endpoint == "" {
		return "", errors.New("container has no endpoint")
	}
	shared.container = container
	return "postgres://postgres@" + endpoint + "/postgres?sslmode=disable", nil
}

// WorkNotifications runs fn and returns how many notifications of new work
// it sent on schema's work channel. A listener counts them until a sentinel,
// sent after fn on a channel of its own (so that no dispatcher wakes up for
// it): PostgreSQL delivers notifications in commit order, so the sentinel
// arrives after everything fn's transactions sent.
func WorkNotifications(tb testing.TB, schema string, fn func()) int {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := Pool(tb).Acquire(ctx)
	if err != nil {
		tb.Fatalf("acquire a listener: %v", err)
	}
	defer conn.Release()
	work, sentinel := ident.WorkChannel(schema), NewSchemaName(tb)
	for _, channel := range []string{work, sentinel} {
		if _, err := conn.Exec(ctx, "LISTEN "+ident.Quote(channel)); err != nil {
			tb.Fatalf("listen: %v", err)
		}
	}
	defer func() {
		if _, err := conn.Exec(ctx, "UNLISTEN *"); err != nil {
			tb.Errorf("unlisten: %v", err)
		}
	}()

	fn()

	if _, err := Pool(tb).Exec(ctx, "SELECT pg_notify($1, '')", sentinel); err != nil {
		tb.Fatalf("send the sentinel: %v", err)
	}
	for count := 0; ; {
		notification, err := conn.Conn().WaitForNotification(ctx)
		if err != nil {
			tb.Fatalf("wait for notifications: %v", err)
		}
		if notification.Channel == sentinel {
			return count
		}
		count++
	}
}

// StoredKey returns a key's stored form, the 32-byte digest that its text
// form k1_<hex> spells, for tests that read or edit pgonce_key by hand.
func StoredKey(tb testing.TB, key string) []byte {
	tb.Helper()
	digest, err := hex.DecodeString(strings.TrimPrefix(key, store.KeyPrefix))
	if err != nil || len(digest) != 32 || !strings.HasPrefix(key, store.KeyPrefix) {
		tb.Fatalf("%q is not a well-formed key", key)
	}
	return digest
}

// TombstoneStatement returns an UPDATE that turns the finished key $1 (its
// stored form, see StoredKey) of schema into a tombstone, as retention
// would: completed at $2 (a timestamptz; NULL keeps the key's own
// completion time) and forgotten a year after that.
func TombstoneStatement(schema string) string {
	return `UPDATE ` + ident.Quote(schema) + `.pgonce_key SET
		state = 'expired', tenant = NULL, run_id = NULL, step = NULL, business_key = NULL, tool = NULL,
		natural_id = NULL, args = NULL, response = NULL, failure = NULL, last_error = NULL,
		first_attempted_at = NULL, expires_at = NULL, metadata = NULL, delivery = NULL, key_retention_ms = NULL,
		expired_state = state,
		completed_at = coalesce($2::timestamptz, completed_at),
		forget_at = coalesce($2::timestamptz, completed_at) + interval '1 year'
		WHERE key = $1`
}

// NewDatabase creates an empty database that no other test uses, for a
// program that migrates pgonce's default schema (the README's quick start),
// and returns its URL. The database is dropped when tb ends, its
// connections closed.
func NewDatabase(tb testing.TB) string {
	tb.Helper()
	base := DatabaseURL(tb)
	name := NewSchemaName(tb)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := Pool(tb).Exec(ctx, "CREATE DATABASE "+ident.Quote(name)); err != nil {
		tb.Fatalf("create database %s: %v", name, err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := Pool(tb).Exec(ctx, "DROP DATABASE IF EXISTS "+ident.Quote(name)+" WITH (FORCE)"); err != nil {
			tb.Errorf("drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		tb.Fatalf("parse database url: %v", err)
	}
	u.Path = "/" + name
	return u.String()
}
