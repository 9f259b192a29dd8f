package dispatcher_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/migrations"
	"github.com/pgonce/pgonce/outbox"
)

// ExampleDispatcher_Run runs a dispatcher beside the code that submits: a
// submitted refund is called once, with its key, and the submitter waits
// for the stored response. On shutdown the dispatcher's context is
// cancelled and Run is awaited before the pool closes, so that calls in
// flight are recorded.
func ExampleDispatcher_Run() {
	ctx := context.Background()

	// The database: PGONCE_TEST_DATABASE_URL, as pgonce's own tests use it.
	pool, err := pgxpool.New(ctx, cmp.Or(os.Getenv("PGONCE_TEST_DATABASE_URL"),
		"postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer func() { _ = db.Close() }()

	// A schema of its own, so that examples running at once never meet; a
	// service migrates "pgonce" (the default) at start-up.
	schema := "example_" + strings.ToLower(rand.Text())
	if err := migrations.Up(ctx, db, schema); err != nil {
		panic(err)
	}
	defer func() { _, _ = db.ExecContext(context.WithoutCancel(ctx), `DROP SCHEMA "`+schema+`" CASCADE`) }()

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
