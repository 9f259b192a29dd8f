package dispatcher_test

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/exampledb"
	"github.com/pgonce/pgonce/outbox"
)

// ExampleDispatcher_Run runs a dispatcher beside the code that submits: a
// submitted refund is called once, with its key, and the submitter waits
// for the stored response. On shutdown the dispatcher's context is
// cancelled and Run is awaited before the pool closes, so that calls in
// flight are recorded.
func ExampleDispatcher_Run() {
	ctx := context.Background()

	// A database and a migrated schema of the example's own, so that
	// examples running at once never meet; a service migrates "pgonce"
	// (the default) at start-up with migrations.Up.
	exampleDB, dropDB := exampledb.ForExample()
	defer dropDB()
	pool, schema := exampleDB.Pool, exampleDB.Schema

	// The provider passes the key downstream, as its idempotency key.
	registry := outbox.NewRegistry()
	refunds := outbox.ProviderFunc(func(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
		fmt.Printf("refund called: attempt %d, args %s\n", req.Attempt, req.Args)
		return json.RawMessage(`{"refund_id":"re_1"}`), nil
	})
	if err := registry.Register("refund", refunds, outbox.IdempotentByKey); err != nil {
		panic(err)
	}
	client, err := outbox.NewPgx(pool, outbox.Config{Schema: schema, Registry: registry})
	if err != nil {
		panic(err)
	}

	d, err := dispatcher.New(client, dispatcher.Config{Concurrency: 8})
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()

	res, err := client.Submit(ctx, outbox.Call{
		RunID: "run_01J9Z",
		Step:  3,
		Tool:  "refund",
		Args:  map[string]any{"order": 8842, "amount": "42.00"},
	})
	if err != nil {
		panic(err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err = client.Wait(waitCtx, res.Key)
	if err != nil {
		panic(err)
	}
	fmt.Printf("state=%s response=%s\n", res.State, res.Response)

	// Shut down: stop claiming, let calls in flight finish, then close.
	stop()
	if err := <-done; err != nil {
		panic(err)
	}

	// Output:
	// refund called: attempt 1, args {"amount":"42.00","order":8842}
	// state=succeeded response={"refund_id":"re_1"}
}
