package outbox_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/pgonce/pgonce/internal/exampledb"
	"github.com/pgonce/pgonce/outbox"
)

// ExampleClient_SubmitManyTx submits the three tool calls of one agent turn
// inside the caller's pgx transaction, with one statement. Each call gets
// its own answer: the turn replayed finds its keys, and a step asked again
// with other arguments is a conflict of that call alone.
func ExampleClient_SubmitManyTx() {
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

	turn := []outbox.Call{
		{RunID: "run_01J9Z", Step: 1, Tool: "refund", Args: map[string]any{"order": 8842, "amount": "42.00"}},
		{RunID: "run_01J9Z", Step: 2, Tool: "refund", Args: map[string]any{"order": 8843, "amount": "7.50"}},
		{RunID: "run_01J9Z", Step: 3, Tool: "refund", Args: map[string]any{"order": 8844, "amount": "12.00"}},
	}
	submit := func(calls []outbox.Call) []outbox.SubmitManyResult {
		tx, err := pool.Begin(ctx)
		if err != nil {
			panic(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		// ... the application's own writes go here, in tx ...
		results, err := client.SubmitManyTx(ctx, tx, calls)
		if err != nil {
			panic(err) // an invalid call (a *CallError), or the database
		}
		if err := tx.Commit(ctx); err != nil {
			panic(err)
		}
		return results
	}

	for i, r := range submit(turn) {
		fmt.Printf("first  %d: created=%t state=%s\n", i, r.Result.Created, r.Result.State)
	}

	// The turn replayed, but step 3 re-planned with another amount.
	turn[2].Args = map[string]any{"order": 8844, "amount": "120.00"}
	for i, r := range submit(turn) {
		if r.Err != nil {
			fmt.Printf("replay %d: key conflict=%t\n", i, errors.Is(r.Err, outbox.ErrKeyConflict))
			continue
		}
		fmt.Printf("replay %d: created=%t state=%s\n", i, r.Result.Created, r.Result.State)
	}

	// An invalid call writes nothing of its batch, and says which it is.
	tx, err := pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = client.SubmitManyTx(ctx, tx, []outbox.Call{turn[0], {RunID: "run_01J9Z", Step: 4, Tool: "teleport"}})
	if callErr := (*outbox.CallError)(nil); errors.As(err, &callErr) {
		fmt.Printf("invalid: call %d, unknown tool=%t\n", callErr.Index, errors.Is(err, outbox.ErrUnknownTool))
	}

	// Output:
	// first  0: created=true state=pending
	// first  1: created=true state=pending
	// first  2: created=true state=pending
	// replay 0: created=false state=pending
	// replay 1: created=false state=pending
	// replay 2: key conflict=true
	// invalid: call 1, unknown tool=true
}
