package outbox_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgonce/pgonce/migrations"
	"github.com/pgonce/pgonce/outbox"
)

// ExampleClient_Search finds a refund by the order id an operator knows,
// then reads every attempt of it: the payment provider was down for the
// first, and the second went through.
func ExampleClient_Search() {
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

	// A schema of its own, so that examples running at once never meet.
	schema := "example_" + strings.ToLower(rand.Text())
	if err := migrations.Up(ctx, db, schema); err != nil {
		panic(err)
	}
	defer func() { _, _ = db.ExecContext(context.WithoutCancel(ctx), `DROP SCHEMA "`+schema+`" CASCADE`) }()

	// The payment provider is down for the first attempt of every refund.
	payments := outbox.ProviderFunc(func(_ context.Context, req outbox.Request) (json.RawMessage, error) {
		if req.Attempt == 1 {
			return nil, errors.New("503 Service Unavailable")
		}
		return json.RawMessage(`{"id":"re_3NkU"}`), nil
	})
	registry := outbox.NewRegistry()
	if err := registry.Register("refund", payments, outbox.IdempotentByKey); err != nil {
		panic(err)
	}
	client, err := outbox.NewPgx(pool, outbox.Config{
		Schema: schema, Registry: registry, WorkerID: "worker-1", Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	call := outbox.Call{Tenant: "globex", RunID: "run_01J9Z", Step: 3, Tool: "refund", Args: map[string]any{"order": 7731, "amount": "129.00"}}
	for range 2 {
		_, _ = client.Do(ctx, call, nil) // the first says "retry later"
	}

	found, err := client.Search(ctx, outbox.SearchParams{Text: "7731"})
	if err != nil {
		panic(err)
	}
	for _, k := range found.Keys {
		fmt.Printf("%s %s of %s, step %d: %s, matched in %v\n", k.Tool, k.State, k.Tenant, k.Step, k.Args, k.Matched)
		in, err := client.Inspect(ctx, k.Key)
		if err != nil {
			panic(err)
		}
		for _, a := range in.AttemptHistory {
			fmt.Printf("  attempt %d by %s: %s %s\n", a.Attempt, a.Worker, a.Outcome, a.Error)
		}
	}
	// Output:
	// refund succeeded of globex, step 3: {"amount":"129.00","order":7731}, matched in [args]
	//   attempt 1 by worker-1: retry 503 Service Unavailable
	//   attempt 2 by worker-1: succeeded
}
