package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
)

// driverHarness gives a test the same client over either driver, so that
// every client test runs against pgx and database/sql alike, each directly
// and through a PgBouncer in transaction pooling mode.
type driverHarness[TTx any] struct {
	// name names the harness's driver, as [drivertest] names it.
	name      string
	newClient func(t *testing.T, config outbox.Config) *outbox.Client[TTx]
	begin     func(t *testing.T, opts *sql.TxOptions) TTx
	commit    func(tx TTx) error
	rollback  func(tx TTx) error
	// exec runs one statement in tx.
	exec func(tx TTx, query string) error
	// backendPID returns the pid of the server process that runs tx.
	backendPID func(t *testing.T, tx TTx) int
}

// eachHarness runs the test once per driver harness, as parallel subtests
// named by the driver: pgx and database/sql, directly and through the
// shared PgBouncer in transaction pooling mode. Pass the two instances of
// one generic test function.
func eachHarness(t *testing.T, pgxTest func(*testing.T, driverHarness[pgx.Tx]), stdTest func(*testing.T, driverHarness[*sql.Tx])) {
	t.Helper()
	for _, h := range []driverHarness[pgx.Tx]{pgxHarness(), pgxHarnessOver(drivertest.PgxPgBouncer())} {
		t.Run(h.name, func(t *testing.T) {
			t.Parallel()
			pgxTest(t, h)
		})
	}
	for _, h := range []driverHarness[*sql.Tx]{stdHarness(), stdHarnessOver(drivertest.DatabaseSQLPgBouncer(), pgoncetest.PooledDB)} {
		t.Run(h.name, func(t *testing.T) {
			t.Parallel()
			stdTest(t, h)
		})
	}
}

func pgxHarness() driverHarness[pgx.Tx] {
	return pgxHarnessOver(drivertest.Pgx())
}

// pgxHarnessOver is the pgx harness over d's pool and clients.
func pgxHarnessOver(d drivertest.Driver[pgx.Tx]) driverHarness[pgx.Tx] {
	return driverHarness[pgx.Tx]{
		name: d.Name,
		newClient: func(t *testing.T, config outbox.Config) *outbox.Client[pgx.Tx] {
			t.Helper()
			return d.Client(t, config)
		},
		begin: func(t *testing.T, opts *sql.TxOptions) pgx.Tx {
			t.Helper()
			txOpts := pgx.TxOptions{}
			if opts != nil && opts.Isolation == sql.LevelSerializable {
				txOpts.IsoLevel = pgx.Serializable
			}
			if opts != nil && opts.Isolation == sql.LevelRepeatableRead {
				txOpts.IsoLevel = pgx.RepeatableRead
			}
			tx, err := d.Pool(t).BeginTx(t.Context(), txOpts)
			require.NoError(t, err)
			t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
			return tx
		},
		commit:   func(tx pgx.Tx) error { return tx.Commit(context.Background()) },
		rollback: func(tx pgx.Tx) error { return tx.Rollback(context.Background()) },
		exec: func(tx pgx.Tx, query string) error {
			_, err := tx.Exec(context.Background(), query)
			return err
		},
		backendPID: func(t *testing.T, tx pgx.Tx) int {
			t.Helper()
			var pid int
			require.NoError(t, tx.QueryRow(t.Context(), "SELECT pg_backend_pid()").Scan(&pid))
			return pid
		},
	}
}

func stdHarness() driverHarness[*sql.Tx] {
	return stdHarnessOver(drivertest.DatabaseSQL(), pgoncetest.DB)
}

// stdHarnessOver is the database/sql harness over d's clients, and
// transactions of the *sql.DB that dbFunc returns, one over d's pool.
func stdHarnessOver(d drivertest.Driver[*sql.Tx], dbFunc func(tb testing.TB) *sql.DB) driverHarness[*sql.Tx] {
	return driverHarness[*sql.Tx]{
		name: d.Name,
		newClient: func(t *testing.T, config outbox.Config) *outbox.Client[*sql.Tx] {
			t.Helper()
			return d.Client(t, config)
		},
		begin: func(t *testing.T, opts *sql.TxOptions) *sql.Tx {
			t.Helper()
			tx, err := dbFunc(t).BeginTx(t.Context(), opts)
			require.NoError(t, err)
			t.Cleanup(func() { _ = tx.Rollback() })
			return tx
		},
		commit:   func(tx *sql.Tx) error { return tx.Commit() },
		rollback: func(tx *sql.Tx) error { return tx.Rollback() },
		exec: func(tx *sql.Tx, query string) error {
			_, err := tx.ExecContext(context.Background(), query)
			return err
		},
		backendPID: func(t *testing.T, tx *sql.Tx) int {
			t.Helper()
			var pid int
			require.NoError(t, tx.QueryRowContext(t.Context(), "SELECT pg_backend_pid()").Scan(&pid))
			return pid
		},
	}
}

// countingProvider counts its calls and answers with a fixed response.
// refundConfig migrates a schema of t's own and returns a config for it
// whose registry serves "refund" with a keyed provider answering {}.
func refundConfig(t *testing.T) outbox.Config {
	t.Helper()
	schema := pgoncetest.Schema(t)
	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("refund", &countingProvider{response: json.RawMessage(`{}`)}, outbox.IdempotentByKey))
	return outbox.Config{Schema: schema, Registry: registry}
}

type countingProvider struct {
	calls    atomic.Int64
	response json.RawMessage
	err      error
	// hold, when not nil, blocks every call until it is closed.
	hold chan struct{}
}

func (p *countingProvider) Call(ctx context.Context, _ outbox.Request) (json.RawMessage, error) {
	p.calls.Add(1)
	if p.hold != nil {
		select {
		case <-p.hold:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return p.response, p.err
}

// lookupProvider is a natural-id provider backed by a map of effects.
type lookupProvider struct {
	countingProvider
	lookups atomic.Int64
	found   json.RawMessage
}

func (p *lookupProvider) Lookup(context.Context, outbox.Request) (json.RawMessage, bool, error) {
	p.lookups.Add(1)
	return p.found, p.found != nil, nil
}

// rowCounts returns how many keys schema holds, and how many of them are
// open: the outbox entries, pending or in flight.
func rowCounts(t *testing.T, schema string) (keys, outboxRows int) {
	t.Helper()
	pool := pgoncetest.Pool(t)
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM "`+schema+`".pgonce_key`).Scan(&keys))
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM "`+schema+`".pgonce_key WHERE state = 'open'`).Scan(&outboxRows))
	return keys, outboxRows
}

// TestPooledHarnessGoesThroughPgBouncer checks the harness: the pooled
// drivers' pool and *sql.DB reach the server through PgBouncer, which drops
// the empty search_path that the direct ones ask for, and their clients
// are told they are behind a transaction pooler.
func TestPooledHarnessGoesThroughPgBouncer(t *testing.T) {
	t.Parallel()
	searchPath := func(t *testing.T, row interface{ Scan(...any) error }) string {
		t.Helper()
		var path string
		require.NoError(t, row.Scan(&path))
		return path
	}
	const query = "SELECT current_setting('search_path')"
	require.Empty(t, searchPath(t, pgoncetest.Pool(t).QueryRow(t.Context(), query)))
	require.Empty(t, searchPath(t, pgoncetest.DB(t).QueryRowContext(t.Context(), query)))
	require.NotEmpty(t, searchPath(t, pgoncetest.PooledPool(t).QueryRow(t.Context(), query)))
	require.NotEmpty(t, searchPath(t, pgoncetest.PooledDB(t).QueryRowContext(t.Context(), query)))

	config := refundConfig(t)
	pgxClient := drivertest.PgxPgBouncer().Client(t, config)
	require.Equal(t, outbox.PoolingTransaction, pgxClient.Config().Pooling)
	require.NotNil(t, pgxClient.Config().ListenConnectFunc)
	stdClient := drivertest.DatabaseSQLPgBouncer().Client(t, config)
	require.Equal(t, outbox.PoolingTransaction, stdClient.Config().Pooling)
	require.NoError(t, stdClient.CheckSchema(t.Context()), "the exec mode is one a transaction pooler allows")
}
