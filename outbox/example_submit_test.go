package outbox_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/migrations"
	"github.com/pgonce/pgonce/outbox"
)

// ExampleClient_SubmitTx submits a refund inside the caller's own
// database/sql transaction. The key and its outbox row commit or roll back
// with the caller's other writes; a dispatcher runs the refund after commit.
func ExampleClient_SubmitTx() {
	ctx := context.Background()
	db, _, schema, cleanup := exampleDB()
	defer cleanup()

	registry := outbox.NewRegistry()
	if err := registry.Register("refund", exampleRefundProvider(), outbox.IdempotentByKey); err != nil {
		panic(err)
	}
	client, err := outbox.New(db, outbox.Config{Schema: schema, Registry: registry})
	if err != nil {
		panic(err)
	}

	call := outbox.Call{
		RunID: "run_01J9Z",
		Step:  3,
		Tool:  "refund",
		Args:  map[string]any{"order": 8842, "amount": "42.00"},
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		panic(err)
	}
	defer func() { _ = tx.Rollback() }()

	// ... the application's own writes go here, in tx ...

	res, err := client.SubmitTx(ctx, tx, call)
	if err != nil {
		panic(err)
	}
	if err := tx.Commit(); err != nil {
		panic(err)
	}
	fmt.Printf("first:  created=%t state=%s\n", res.Created, res.State)

	// The same action asked for again (a retried request, a replayed agent
	// turn) finds the key: nothing new is written, and until a dispatcher
	// has run the refund the answer is "in progress, retry later".
	res, err = client.Submit(ctx, call)
	if err != nil {
		panic(err)
	}
	fmt.Printf("again:  created=%t state=%s retry_after_set=%t\n", res.Created, res.State, res.RetryAfter > 0)

	// Output:
	// first:  created=true state=pending
	// again:  created=false state=pending retry_after_set=true
}

// ExampleClient_SubmitTx_pgx is ExampleClient_SubmitTx with pgx: the client
// is a Client[pgx.Tx] and SubmitTx takes the caller's pgx.Tx. A rolled-back
// transaction leaves no trace of the key.
func ExampleClient_SubmitTx_pgx() {
	ctx := context.Background()
	_, pool, schema, cleanup := exampleDB()
	defer cleanup()

	registry := outbox.NewRegistry()
	if err := registry.Register("refund", exampleRefundProvider(), outbox.IdempotentByKey); err != nil {
		panic(err)
	}
	client, err := outbox.NewPgx(pool, outbox.Config{Schema: schema, Registry: registry})
	if err != nil {
		panic(err)
	}

	call := outbox.Call{
		RunID: "run_01J9Z",
		Step:  3,
		Tool:  "refund",
		Args:  map[string]any{"order": 8842, "amount": "42.00"},
	}

	// A transaction that rolls back takes the key and the outbox row with it.
	tx, err := pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	res, err := client.SubmitTx(ctx, tx, call)
	if err != nil {
		panic(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		panic(err)
	}
	_, err = client.Get(ctx, res.Key)
	fmt.Printf("rolled back: not found=%t\n", errors.Is(err, outbox.ErrNotFound))

	// Committed, the key exists and a duplicate finds it.
	tx, err = pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	res, err = client.SubmitTx(ctx, tx, call)
	if err != nil {
		panic(err)
	}
	if err := tx.Commit(ctx); err != nil {
		panic(err)
	}
	fmt.Printf("committed:   created=%t state=%s\n", res.Created, res.State)

	res, err = client.Submit(ctx, call)
	if err != nil {
		panic(err)
	}
	fmt.Printf("again:       created=%t state=%s\n", res.Created, res.State)

	// Output:
	// rolled back: not found=true
	// committed:   created=true state=pending
	// again:       created=false state=pending
}

// exampleRefundProvider stands in for a payment provider's refund call.
func exampleRefundProvider() outbox.Provider {
	return outbox.ProviderFunc(func(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
		return json.RawMessage(`{"refund_id":"re_1"}`), nil
	})
}

// exampleDB connects to the test database the way the tests' harness does
// (pgoncetest.DatabaseURLEnv, else pgoncetest.DatabaseURLDefault), migrates a
// fresh schema and returns both handles over one pool. cleanup drops the
// schema and closes the handles, so that the package's leak check passes.
// Examples have no *testing.T, hence no pgoncetest.Schema.
func exampleDB() (db *sql.DB, pool *pgxpool.Pool, schema string, cleanup func()) {
	ctx := context.Background()
	// The test harness finds the database (PGONCE_TEST_DATABASE_URL, the
	// local server, or a container) and closes it when the tests end.
	pool, db, err := pgoncetest.Shared()
	if err != nil {
		panic(err)
	}
	var suffix [6]byte
	_, _ = rand.Read(suffix[:])
	schema = "pgonce_example_" + hex.EncodeToString(suffix[:])
	if err := migrations.Up(ctx, db, schema); err != nil {
		panic(fmt.Sprintf("migrate example schema %s: %v", schema, err))
	}
	cleanup = func() {
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+ident.Quote(schema)+" CASCADE"); err != nil {
			panic(fmt.Sprintf("drop example schema %s: %v", schema, err))
		}
	}
	return db, pool, schema, cleanup
}
