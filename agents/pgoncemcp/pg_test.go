package pgoncemcp_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/oncetest"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/reconcile"
)

// databaseURLDefault is the database the tests use unless
// PGONCE_TEST_DATABASE_URL names another, as pgonce's own tests do.
const databaseURLDefault = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

var (
	poolOnce sync.Once
	pool     *pgxpool.Pool
	errPool  error
)

// testPool returns the pool the package's tests share. A database that
// cannot be reached fails the test, which says which database it tried.
func testPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	url := cmp.Or(os.Getenv("PGONCE_TEST_DATABASE_URL"), databaseURLDefault)
	poolOnce.Do(func() {
		config, err := pgxpool.ParseConfig(url)
		if err != nil {
			errPool = err
			return
		}
		config.MaxConns = 32
		pool, errPool = pgxpool.NewWithConfig(context.Background(), config)
		if errPool == nil {
			errPool = pool.Ping(context.Background())
		}
	})
	require.NoError(t, errPool, "PostgreSQL at %s (set PGONCE_TEST_DATABASE_URL)", url)
	return pool
}

// ledger is a payment provider that honours idempotency keys, as Stripe
// does: the first call with a key refunds (a row of its table), every later
// call with the key answers the same refund. A test counts its rows, the
// effects, not its calls.
type ledger struct {
	pool  *pgxpool.Pool
	table string
	calls atomic.Int64
	// before runs before the refund and after runs after it, when set.
	before, after func(ctx context.Context) error
	// detached refunds whatever the call's deadline: a crashed process's
	// provider, which must act before it hangs however slow the machine.
	detached bool
}

func newLedger(t *testing.T, schema string) *ledger {
	t.Helper()
	p := testPool(t)
	table := pgx.Identifier{schema, "ledger"}.Sanitize()
	_, err := p.Exec(t.Context(), `CREATE TABLE `+table+` (
		key text PRIMARY KEY, refund_id bigserial, order_id bigint NOT NULL, amount text NOT NULL)`)
	require.NoError(t, err)
	return &ledger{pool: p, table: table}
}

func (l *ledger) Call(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
	l.calls.Add(1)
	if l.before != nil {
		if err := l.before(ctx); err != nil {
			return nil, err
		}
	}
	var args struct {
		Order  int64  `json:"order"`
		Amount string `json:"amount"`
	}
	if err := json.Unmarshal(req.Args, &args); err != nil {
		return nil, outbox.Permanent(err)
	}
	if l.detached {
		ctx = context.WithoutCancel(ctx)
	}
	if _, err := l.pool.Exec(ctx, `INSERT INTO `+l.table+` (key, order_id, amount) VALUES ($1, $2, $3)
		ON CONFLICT (key) DO NOTHING`, string(req.Key), args.Order, args.Amount); err != nil {
		return nil, err
	}
	var id int64
	if err := l.pool.QueryRow(ctx, `SELECT refund_id FROM `+l.table+` WHERE key = $1`, string(req.Key)).Scan(&id); err != nil {
		return nil, err
	}
	if l.after != nil {
		if err := l.after(ctx); err != nil {
			return nil, err
		}
	}
	// The provider's own spacing, kept byte for byte.
	return json.RawMessage(fmt.Sprintf(`{"refund_id": "re_%d",  "order": %d, "amount": %q}`, id, args.Order, args.Amount)), nil
}

// refunds counts the ledger's rows.
func (l *ledger) refunds(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, l.pool.QueryRow(context.WithoutCancel(t.Context()), `SELECT count(*) FROM `+l.table).Scan(&n))
	return n
}

// bundle is one test's schema, ledger and client.
type bundle struct {
	schema string
	ledger *ledger
	client *outbox.Client[pgx.Tx]
}

// setup migrates a schema of the test's own, with a ledger, and returns a
// client whose registry is empty, for a guard or a caller to register its
// tools in.
func setup(t *testing.T) *bundle {
	t.Helper()
	p := testPool(t)
	schema := oncetest.SchemaPgx(t, p)
	l := newLedger(t, schema)
	return &bundle{schema: schema, ledger: l, client: newClient(t, schema, outbox.Config{})}
}

// newClient returns a client over schema with an empty registry: the client
// of one process.
func newClient(t *testing.T, schema string, config outbox.Config) *outbox.Client[pgx.Tx] {
	t.Helper()
	config.Schema, config.Registry = schema, outbox.NewRegistry()
	client, err := outbox.NewPgx(testPool(t), config)
	require.NoError(t, err)
	return client
}

// crashedClient returns the client of a process that will crash: its lease
// is the shortest its call timeout allows, so that it expires soon.
func crashedClient(t *testing.T, schema string) *outbox.Client[pgx.Tx] {
	t.Helper()
	return newClient(t, schema, outbox.Config{
		CallTimeout: 50 * time.Millisecond, Lease: 50*time.Millisecond + outbox.LeaseMarginMin,
	})
}

// dies returns a hook that, once called, never returns until the test ends,
// as a process that died never records anything, and a channel closed once it
// was called.
func dies(t *testing.T) (hook func(ctx context.Context) error, called <-chan struct{}) {
	t.Helper()
	dead, acted := make(chan struct{}), make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { close(dead) })
	return func(context.Context) error {
		once.Do(func() { close(acted) })
		<-dead
		return nil
	}, acted
}

// keyOf derives the key a guard or a caller derives for a refund at step of
// run runID.
func keyOf(t *testing.T, runID string, step int64, args string) outbox.Key {
	t.Helper()
	key, err := outbox.DeriveKey(outbox.Call{RunID: runID, Step: step, Tool: "refund", Args: json.RawMessage(args)})
	require.NoError(t, err)
	return key
}

// reconcileUntilResolved runs the reconciler over client until it has
// resolved an expired lease: the crashed attempt's, once it expires.
func reconcileUntilResolved(t *testing.T, client *outbox.Client[pgx.Tx]) {
	t.Helper()
	r, err := reconcile.New(client, reconcile.Config{Grace: time.Millisecond, PruneDisabled: true})
	require.NoError(t, err)
	for {
		report, err := r.RunOnce(t.Context())
		require.NoError(t, err)
		if len(report.Examined) > 0 {
			return
		}
		select {
		case <-t.Context().Done():
			t.Fatal("the crashed attempt's lease never expired")
		case <-time.After(20 * time.Millisecond):
		}
	}
}
