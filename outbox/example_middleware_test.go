package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/pgonce/pgonce/internal/exampledb"
	"github.com/pgonce/pgonce/outbox"
)

// ExampleMiddleware wraps every provider call of a client: one middleware
// logs each call with its outcome, another refuses the calls of a blocked
// tenant before they reach the provider.
func ExampleMiddleware() {
	ctx := context.Background()
	// A database and a migrated schema of the example's own (see
	// ExampleClient_SubmitTx).
	exampleDB, dropDB := exampledb.ForExample()
	defer dropDB()
	pool, schema := exampleDB.Pool, exampleDB.Schema

	logCalls := outbox.MiddlewareFunc(func(ctx context.Context, call *outbox.ProviderCall, next func(ctx context.Context) outbox.ProviderResult) outbox.ProviderResult {
		res := next(ctx)
		fmt.Printf("%s %s attempt=%d outcome=%s\n", call.Op, call.Request.Tool, call.Request.Attempt, res.Outcome)
		return res
	})
	refuseBlocked := outbox.MiddlewareFunc(func(ctx context.Context, call *outbox.ProviderCall, next func(ctx context.Context) outbox.ProviderResult) outbox.ProviderResult {
		if call.Request.Metadata["tenant"] == "blocked" {
			// Permanent: the key fails for good, and the provider is never called.
			return outbox.ProviderResult{Err: outbox.Permanent(errors.New("tenant is blocked"))}
		}
		return next(ctx)
	})

	registry := outbox.NewRegistry()
	refund := outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
		return json.RawMessage(`{"refund_id":"re_1"}`), nil
	})
	if err := registry.Register("refund", refund, outbox.IdempotentByKey); err != nil {
		panic(err)
	}
	client, err := outbox.NewPgx(pool, outbox.Config{
		Schema:     schema,
		Registry:   registry,
		Middleware: []outbox.Middleware{logCalls, refuseBlocked},
	})
	if err != nil {
		panic(err)
	}

	for i, tenant := range []string{"acme", "blocked"} {
		res, err := client.Do(ctx, outbox.Call{
			RunID:    "run_01J9Z",
			Step:     int64(i),
			Tool:     "refund",
			Args:     map[string]any{"order": 8842 + i},
			Metadata: map[string]string{"tenant": tenant},
		}, nil)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s: %s\n", tenant, res.State)
	}

	// Output:
	// call refund attempt=1 outcome=succeeded
	// acme: succeeded
	// call refund attempt=1 outcome=failed
	// blocked: failed
}
