package storagebench_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

const (
	// refundTool is the one tool the benchmarks register.
	refundTool = "refund"

	// keyTable is the table whose size is measured.
	keyTable = "pgonce_key"

	// submitsPerTx is how many calls one bulk transaction submits.
	submitsPerTx = 1000

	// refundResponseFormat is the provider's response: exactly
	// refundResponseBytes bytes for every refund number up to 11 digits.
	refundResponseFormat = `{"refund_id":"re_%011d","status":"succeeded","amt":42}`
	refundResponseBytes  = 60

	// benchTimeout bounds every wait, so that a lost outcome fails the
	// benchmark instead of hanging it.
	benchTimeout = 30 * time.Minute
)

// refundProvider succeeds at once with a 60-byte refund confirmation.
type refundProvider struct {
	calls atomic.Int64
}

// Call implements [outbox.Provider].
func (p *refundProvider) Call(context.Context, outbox.Request) (json.RawMessage, error) {
	return fmt.Appendf(nil, refundResponseFormat, p.calls.Add(1)), nil
}

// refundRegistry returns a registry whose refund tool is served by a
// [refundProvider].
func refundRegistry(tb testing.TB) *outbox.Registry {
	tb.Helper()
	registry := outbox.NewRegistry()
	require.NoError(tb, registry.Register(refundTool, &refundProvider{}, outbox.IdempotentByKey))
	return registry
}

// callNumbers numbers the calls of the whole process, so that no two
// submits anywhere share a run and step.
var callNumbers atomic.Int64

// refundCall returns the refund call numbered n: ten steps per run, with
// arguments of the size an agent's refund tool takes.
func refundCall(n int64) outbox.Call {
	return outbox.Call{
		RunID: fmt.Sprintf("run-%06d", n/10),
		Step:  n % 10,
		Tool:  refundTool,
		Args:  map[string]any{"order": 8842 + n, "amount": "42.00", "currency": "EUR"},
	}
}

// envInt reads a positive count from the environment, or returns fallback.
func envInt(tb testing.TB, name string, fallback int) int {
	tb.Helper()
	value := os.Getenv(name)
	if value == "" {
		return fallback
	}
	n, err := strconv.Atoi(strings.ReplaceAll(value, "_", ""))
	if err != nil || n < 1 {
		tb.Fatalf("%s=%q: want a positive integer", name, value)
	}
	return n
}

// newPool returns a pgx pool of its own whose connections carry
// applicationName, so that [closePool] can wait until the server has ended
// them, and with them flushed their table statistics.
func newPool(tb testing.TB, applicationName string, maxConns int32) *pgxpool.Pool {
	tb.Helper()
	config, err := pgxpool.ParseConfig(pgoncetest.DatabaseURL(tb))
	require.NoError(tb, err)
	config.ConnConfig.RuntimeParams["search_path"] = ""
	config.ConnConfig.RuntimeParams["application_name"] = applicationName
	config.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), config)
	require.NoError(tb, err)
	tb.Cleanup(pool.Close)
	return pool
}

// newApplicationName returns an application name no other pool uses.
func newApplicationName(what string) string {
	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	return "storagebench-" + what + "-" + hex.EncodeToString(suffix[:])
}

// closePool closes pool and waits until every backend of applicationName
// has exited. A backend flushes its pending table statistics before it
// leaves pg_stat_activity, so pg_stat_user_tables then counts everything
// the pool did: its counters are otherwise flushed at most once a second,
// and by an idle backend only some seconds later.
func closePool(tb testing.TB, pool *pgxpool.Pool, applicationName string) {
	tb.Helper()
	pool.Close()
	awaitCondition(tb, "the backends of "+applicationName+" to exit", func() bool {
		var backends int
		require.NoError(tb, pgoncetest.Pool(tb).QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, applicationName).Scan(&backends))
		return backends == 0
	})
}

// awaitCondition polls done until it holds, and fails tb after
// benchTimeout.
func awaitCondition(tb testing.TB, what string, done func() bool) {
	tb.Helper()
	deadline := time.Now().Add(benchTimeout)
	for !done() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// submitBulk submits count refund calls through client, submitsPerTx to a
// transaction of pool, and returns their keys.
func submitBulk(tb testing.TB, client *outbox.Client[pgx.Tx], pool *pgxpool.Pool, count int) []outbox.Key {
	tb.Helper()
	ctx := context.Background()
	keys := make([]outbox.Key, 0, count)
	for len(keys) < count {
		tx, err := pool.Begin(ctx)
		require.NoError(tb, err)
		for range min(submitsPerTx, count-len(keys)) {
			res, err := client.SubmitTx(ctx, tx, refundCall(callNumbers.Add(1)))
			if err != nil {
				_ = tx.Rollback(ctx)
				require.NoError(tb, err)
			}
			require.True(tb, res.Created, "a fresh call must create its key")
			keys = append(keys, res.Key)
		}
		require.NoError(tb, tx.Commit(ctx))
	}
	return keys
}

// drainConfig is the dispatcher of every drain: no-op calls are cheap, so
// many slots and big batches make few, large transactions. Maintenance is
// off: each drain starts a dispatcher, which would otherwise be elected
// and reconcile and prune beside the claims it times.
var drainConfig = dispatcher.Config{
	Concurrency:         512,
	BatchSize:           512,
	PollInterval:        100 * time.Millisecond,
	MaintenanceDisabled: true,
}

// drain runs a dispatcher over client until count outcomes are recorded in
// schema, and returns the time from its start to the last outcome's
// commit. The pending keys must be there before it is called; none may be
// pending besides them.
func drain(tb testing.TB, client *outbox.Client[pgx.Tx], schema string, count int) time.Duration {
	tb.Helper()
	done := listenDone(tb, schema)
	defer done.stop()
	d, err := dispatcher.New(client, drainConfig)
	require.NoError(tb, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	began := time.Now()
	stopped := make(chan error, 1)
	go func() { stopped <- d.Run(ctx) }()
	done.await(tb, count)
	elapsed := time.Since(began)
	cancel()
	require.NoError(tb, <-stopped)
	return elapsed
}

// doneListener counts the keys notified on a schema's done channel: each
// notification carries the comma-separated keys whose outcomes committed.
type doneListener struct {
	keys chan int
	stop func()
}

// listenDone listens on schema's done channel until stop is called.
func listenDone(tb testing.TB, schema string) *doneListener {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := pgoncetest.Pool(tb).Acquire(ctx)
	require.NoError(tb, err)
	if _, err := conn.Exec(ctx, "LISTEN "+ident.Quote(ident.DoneChannel(schema))); err != nil {
		conn.Release()
		cancel()
		require.NoError(tb, err)
	}
	l := &doneListener{keys: make(chan int, 1024)}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			notification, err := conn.Conn().WaitForNotification(ctx)
			if err != nil {
				return
			}
			l.keys <- strings.Count(notification.Payload, ",") + 1
		}
	}()
	l.stop = func() {
		cancel()
		<-stopped
		// A cancelled wait closes the connection, so it never returns to
		// the pool listening.
		conn.Release()
	}
	return l
}

// await waits until count keys were notified.
func (l *doneListener) await(tb testing.TB, count int) {
	tb.Helper()
	timeout := time.After(benchTimeout)
	for seen := 0; seen < count; {
		select {
		case n := <-l.keys:
			seen += n
		case <-timeout:
			tb.Fatalf("timed out waiting for outcomes: %d of %d recorded", seen, count)
		}
	}
}

// relationSize is the size of one relation.
type relationSize struct {
	Name  string
	Bytes int64
}

// tableSize is the size of the key table: its heap with TOAST, and each of
// its indexes.
type tableSize struct {
	Rows    int64
	Heap    int64
	Toast   int64
	Indexes []relationSize
}

// Total is the heap, TOAST and every index together.
func (s tableSize) Total() int64 {
	total := s.Heap + s.Toast
	for _, index := range s.Indexes {
		total += index.Bytes
	}
	return total
}

// measureTable returns the sizes of schema's key table, and counts its rows.
func measureTable(tb testing.TB, schema string) tableSize {
	tb.Helper()
	ctx := context.Background()
	pool := pgoncetest.Pool(tb)
	table := ident.Quote(schema) + "." + ident.Quote(keyTable)
	var size tableSize
	require.NoError(tb, pool.QueryRow(ctx, `SELECT
			pg_relation_size(c.oid),
			coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0)
		FROM pg_class AS c
		WHERE c.oid = $1::regclass`, table).Scan(&size.Heap, &size.Toast))
	rows, err := pool.Query(ctx, `SELECT
			i.relname::text,
			pg_relation_size(i.oid)
		FROM pg_index AS x
		JOIN pg_class AS i ON i.oid = x.indexrelid
		WHERE x.indrelid = $1::regclass
		ORDER BY i.relname`, table)
	require.NoError(tb, err)
	size.Indexes, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (relationSize, error) {
		var r relationSize
		return r, row.Scan(&r.Name, &r.Bytes)
	})
	require.NoError(tb, err)
	require.NoError(tb, pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&size.Rows))
	return size
}

// horizonWait bounds how long vacuumFull waits for older transactions.
const horizonWait = 5 * time.Minute

// vacuumFull rewrites schema's key table compactly, as a table that was
// never updated would be. VACUUM FULL keeps the row versions that a
// transaction still open might see, so it first waits, up to horizonWait,
// until no other transaction of the database began before the table's last
// write; it reports false when one did not end in time and the table may
// have kept such versions.
func vacuumFull(tb testing.TB, schema string) (clean bool) {
	tb.Helper()
	ctx := context.Background()
	pool := pgoncetest.Pool(tb)
	table := ident.Quote(schema) + "." + ident.Quote(keyTable)
	deadline := time.Now().Add(horizonWait)
	for {
		// The youngest xmin among the table's rows is its last write; a
		// transaction whose snapshot or id is at least as old may still
		// see what that write replaced.
		var older int
		require.NoError(tb, pool.QueryRow(ctx, `SELECT count(*)
			FROM pg_stat_activity
			WHERE datname = current_database()
				AND pid <> pg_backend_pid()
				AND greatest(age(backend_xmin), age(backend_xid)) >= (SELECT min(age(xmin)) FROM `+table+`)`).Scan(&older))
		if older == 0 {
			clean = true
			break
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "storagebench: %d transactions older than the last write to %s are still open after %s; "+
				"VACUUM FULL may keep row versions they can see\n", older, table, horizonWait)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	_, err := pool.Exec(ctx, `VACUUM FULL `+table)
	require.NoError(tb, err)
	return clean
}

// updateCounters are the cumulative update counters of a table.
type updateCounters struct {
	Updates    int64
	HOTUpdates int64
}

// readUpdateCounters reads the update counters of schema's key table. Only
// what backends have flushed is counted: see [closePool].
func readUpdateCounters(tb testing.TB, schema string) updateCounters {
	tb.Helper()
	var c updateCounters
	require.NoError(tb, pgoncetest.Pool(tb).QueryRow(context.Background(), `SELECT
			n_tup_upd,
			n_tup_hot_upd
		FROM pg_stat_user_tables
		WHERE relid = $1::regclass`, ident.Quote(schema)+"."+ident.Quote(keyTable)).Scan(&c.Updates, &c.HOTUpdates))
	return c
}

// hotShare is the share of HOT updates between two readings of the
// counters, and the number of updates in between.
func hotShare(before, after updateCounters) (share float64, updates int64) {
	updates = after.Updates - before.Updates
	if updates == 0 {
		return 0, 0
	}
	return float64(after.HOTUpdates-before.HOTUpdates) / float64(updates), updates
}

// perKey divides bytes by keys, to one decimal.
func perKey(bytes, keys int64) float64 {
	if keys == 0 {
		return 0
	}
	return math.Round(float64(bytes)*10/float64(keys)) / 10
}

// columnSize is the average number of bytes a column takes in a row.
type columnSize struct {
	Name  string
	Bytes float64
}

// measureColumns returns the average stored size of each column of
// schema's key table (zero for NULL), in column order, and of the whole row
// as a datum (its tuple header included): where a row's bytes go, whatever
// the columns are.
func measureColumns(tb testing.TB, schema string) (columns []columnSize, row float64) {
	tb.Helper()
	ctx := context.Background()
	pool := pgoncetest.Pool(tb)
	rows, err := pool.Query(ctx, `SELECT column_name::text
		FROM information_schema.columns
		WHERE table_schema = $1
			AND table_name = $2
		ORDER BY ordinal_position`, schema, keyTable)
	require.NoError(tb, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(tb, err)
	averages := []string{`coalesce(avg(pg_column_size(t.*)), 0)::float8`}
	for _, name := range names {
		averages = append(averages, `coalesce(avg(coalesce(pg_column_size(t.`+ident.Quote(name)+`), 0)), 0)::float8`)
	}
	values := make([]float64, len(averages))
	targets := make([]any, len(values))
	for i := range values {
		targets[i] = &values[i]
	}
	require.NoError(tb, pool.QueryRow(ctx, `SELECT `+strings.Join(averages, ", ")+
		` FROM `+ident.Quote(schema)+"."+ident.Quote(keyTable)+` AS t`).Scan(targets...))
	for i, name := range names {
		columns = append(columns, columnSize{Name: name, Bytes: math.Round(values[i+1]*10) / 10})
	}
	return columns, math.Round(values[0]*10) / 10
}
