package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/pgonce/pgonce/internal/exampledb"
	"github.com/pgonce/pgonce/outbox"
)

// ExampleClient_WaitResult shows the request that submits a call and waits
// for it told the outcome is its own, and a duplicate told it is a replay.
func ExampleClient_WaitResult() {
	ctx := context.Background()
	// A database and a migrated schema of the example's own (see
	// ExampleClient_SubmitTx).
	exampleDB, dropDB := exampledb.ForExample()
	defer dropDB()
	pool, schema := exampleDB.Pool, exampleDB.Schema

	registry := outbox.NewRegistry()
	refund := outbox.ProviderFunc(func(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
		return json.RawMessage(`{"refund_id":"re_1"}`), nil
	})
	if err := registry.Register("refund", refund, outbox.IdempotentByKey); err != nil {
		panic(err)
	}
	client, err := outbox.NewPgx(pool, outbox.Config{Schema: schema, Registry: registry})
	if err != nil {
		panic(err)
	}
	call := outbox.Call{RunID: "run_01J9Z", Step: 3, Tool: "refund", Args: map[string]any{"order": 8842, "amount": "42.00"}}

	// The request: submit in its own transaction, with its other writes.
	tx, err := pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	submitted, err := client.SubmitTx(ctx, tx, call)
	if err != nil {
		panic(err)
	}
	if err := tx.Commit(ctx); err != nil {
		panic(err)
	}

	// A dispatcher would run the call; here a Do of the same call does.
	if _, err := client.Do(ctx, call, nil); err != nil {
		panic(err)
	}

	// The request waits with the Result of its submit: its own outcome.
	own, err := client.WaitResult(ctx, submitted)
	if err != nil {
		panic(err)
	}
	fmt.Println(string(outbox.ObservationFor(own, err).JSON()))

	// A duplicate (a retry of the same request) is told it is a replay.
	dup, err := client.Submit(ctx, call)
	if err == nil {
		dup, err = client.WaitResult(ctx, dup)
	}
	fmt.Println(string(outbox.ObservationFor(dup, err).JSON()))

	// Output:
	// {"status":"succeeded","key":"k1_aa36dcf33ebbd9faef757155d3dd9dce952e937ea84cef7f7359809820c3cdaa","response":{"refund_id":"re_1"}}
	// {"status":"succeeded","key":"k1_aa36dcf33ebbd9faef757155d3dd9dce952e937ea84cef7f7359809820c3cdaa","replayed":true,"response":{"refund_id":"re_1"}}
}

// ExampleObservationFor turns an error into what the model should see: the
// same step asked again with other arguments is a conflict, and nothing
// runs.
func ExampleObservationFor() {
	ctx := context.Background()
	// A database and a migrated schema of the example's own (see
	// ExampleClient_SubmitTx).
	exampleDB, dropDB := exampledb.ForExample()
	defer dropDB()
	pool, schema := exampleDB.Pool, exampleDB.Schema

	registry := outbox.NewRegistry()
	refund := outbox.ProviderFunc(func(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
		return json.RawMessage(`{"refund_id":"re_1"}`), nil
	})
	if err := registry.Register("refund", refund, outbox.IdempotentByKey); err != nil {
		panic(err)
	}
	client, err := outbox.NewPgx(pool, outbox.Config{Schema: schema, Registry: registry})
	if err != nil {
		panic(err)
	}
	call := outbox.Call{RunID: "run_01J9Z", Step: 3, Tool: "refund", Args: map[string]any{"order": 8842, "amount": "42.00"}}
	if _, err := client.Do(ctx, call, nil); err != nil {
		panic(err)
	}

	// The model re-plans step 3 while asking again.
	call.Args = map[string]any{"order": 8842, "amount": "4200.00"}
	res, err := client.Do(ctx, call, nil)
	fmt.Println(string(outbox.ObservationFor(res, err).JSON()))

	// Arguments without a canonical form never reach the store.
	call.Step, call.Args = 4, json.RawMessage(`{"order": 1, "order": 2}`)
	res, err = client.Do(ctx, call, nil)
	fmt.Println(string(outbox.ObservationFor(res, err).JSON()))

	// Output:
	// {"status":"conflict","key":"k1_d62e3a58cf27d5fc10cb8d09938b5ac1d8fe9a747adbd3ad331e7340ea92e3ea","existing_key":"k1_aa36dcf33ebbd9faef757155d3dd9dce952e937ea84cef7f7359809820c3cdaa","existing_tool":"refund","message":"another action already holds this step or key, so nothing ran; to get that action's result ask again with its original tool and arguments, and ask for a different action under a new step"}
	// {"status":"invalid_arguments","path":"$.order","reason":"duplicate member name","message":"the arguments cannot be used as they are (see path and reason), so nothing ran; correct them and ask again"}
}
