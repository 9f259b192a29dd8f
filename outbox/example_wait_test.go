package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/exampledb"
	"github.com/pgonce/pgonce/outbox"
)

// ExampleClient_Wait is a request handler's view: submit in the handler's
// own transaction, commit, then wait for the outcome as long as the
// request may take. A wait that runs out says where the key stands, and
// the caller answers "in progress, retry later"; once a dispatcher has run
// the call, a wait returns the stored response.
func ExampleClient_Wait() {
	ctx := context.Background()

	// A database and a migrated schema of the example's own, so that
	// examples running at once never meet; a service migrates "pgonce"
	// (the default) at start-up with migrations.Up.
	exampleDB, dropDB := exampledb.ForExample()
	defer dropDB()
	pool, schema := exampleDB.Pool, exampleDB.Schema

	registry := outbox.NewRegistry()
	refunds := outbox.ProviderFunc(func(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
		return json.RawMessage(`{"refund_id":"re_1"}`), nil
	})
	if err := registry.Register("refund", refunds, outbox.IdempotentByKey); err != nil {
		panic(err)
	}
	client, err := outbox.NewPgx(pool, outbox.Config{Schema: schema, Registry: registry})
	if err != nil {
		panic(err)
	}

	// The handler: its own writes and the call commit together.
	tx, err := pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	res, err := client.SubmitTx(ctx, tx, outbox.Call{
		RunID: "run_01J9Z",
		Step:  3,
		Tool:  "refund",
		Args:  map[string]any{"order": 8842, "amount": "42.00"},
	})
	if err != nil {
		panic(err)
	}
	if err := tx.Commit(ctx); err != nil {
		panic(err)
	}

	// No dispatcher runs yet: the wait ends with the request's deadline.
	waitCtx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	got, err := client.Wait(waitCtx, res.Key)
	fmt.Printf("deadline=%t state=%s retry_after_set=%t\n",
		errors.Is(err, context.DeadlineExceeded), got.State, got.RetryAfter > 0)

	// With a dispatcher running, the next wait sees the outcome.
	d, err := dispatcher.New(client, dispatcher.Config{})
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()

	waitCtx, cancel = context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	got, err = client.Wait(waitCtx, res.Key)
	if err != nil {
		panic(err)
	}
	fmt.Printf("state=%s response=%s\n", got.State, got.Response)

	stop()
	if err := <-done; err != nil { // Run has returned: the pool may close
		panic(err)
	}

	// Output:
	// deadline=true state=pending retry_after_set=true
	// state=succeeded response={"refund_id":"re_1"}
}
