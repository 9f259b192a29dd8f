package outbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"

	"github.com/pgonce/pgonce/internal/exampledb"
	"github.com/pgonce/pgonce/outbox"
)

// ExampleClient_Do runs a refund inline, without a dispatcher, and then asks
// for the same refund again: the provider runs once, and the second Do
// replays its stored response byte for byte.
func ExampleClient_Do() {
	ctx := context.Background()
	// A database and a migrated schema of the example's own (see
	// ExampleClient_SubmitTx).
	exampleDB, dropDB := exampledb.ForExample()
	defer dropDB()
	pool, schema := exampleDB.Pool, exampleDB.Schema

	var calls atomic.Int64
	refund := outbox.ProviderFunc(func(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
		calls.Add(1)
		// A real provider sends req.Key downstream, e.g. as the
		// Idempotency-Key header of the payment API's refund request.
		return json.RawMessage(`{"refund_id":"re_1"}`), nil
	})

	registry := outbox.NewRegistry()
	if err := registry.Register("refund", refund, outbox.IdempotentByKey); err != nil {
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

	// A nil provider means the tool's registered one.
	first, err := client.Do(ctx, call, nil)
	if err != nil {
		panic(err)
	}
	fmt.Printf("first:  state=%s replayed=%t response=%s\n", first.State, first.Replayed(), first.Response)

	again, err := client.Do(ctx, call, nil)
	if err != nil {
		panic(err)
	}
	fmt.Printf("again:  state=%s replayed=%t response=%s\n", again.State, again.Replayed(), again.Response)
	fmt.Printf("same key: %t, same bytes: %t, provider calls: %d\n",
		first.Key == again.Key, bytes.Equal(first.Response, again.Response), calls.Load())

	// Output:
	// first:  state=succeeded replayed=false response={"refund_id":"re_1"}
	// again:  state=succeeded replayed=true response={"refund_id":"re_1"}
	// same key: true, same bytes: true, provider calls: 1
}
