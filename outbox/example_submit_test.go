package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/pgonce/pgonce/internal/exampledb"
	"github.com/pgonce/pgonce/outbox"
)

// ExampleClient_SubmitTx submits a refund inside the caller's own
// database/sql transaction. The key and its outbox row commit or roll back
// with the caller's other writes; a dispatcher runs the refund after commit.
func ExampleClient_SubmitTx() {
	ctx := context.Background()
	// A database and a migrated schema of the example's own, so that
	// examples running at once never meet; a service migrates "pgonce"
	// (the default) at start-up with migrations.Up.
	exampleDB, dropDB := exampledb.ForExample()
	defer dropDB()
	db, schema := exampleDB.SQL, exampleDB.Schema

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
	// A database and a migrated schema of the example's own (see
	// ExampleClient_SubmitTx).
	exampleDB, dropDB := exampledb.ForExample()
	defer dropDB()
	pool, schema := exampleDB.Pool, exampleDB.Schema

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
