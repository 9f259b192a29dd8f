package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/pgonce/pgonce/internal/exampledb"
	"github.com/pgonce/pgonce/outbox"
)

// ExampleClient_List pages through the keys an operator acts on: here the
// refunds that failed, a page of two at a time, with the cursor of each
// page passed back for the next.
func ExampleClient_List() {
	ctx := context.Background()

	// A database and a migrated schema of the example's own, so that
	// examples running at once never meet; a service migrates "pgonce"
	// (the default) at start-up with migrations.Up.
	exampleDB, dropDB := exampledb.ForExample()
	defer dropDB()
	pool, schema := exampleDB.Pool, exampleDB.Schema

	// Every refund is declined.
	declined := outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
		return nil, outbox.Permanent(errors.New("card declined"))
	})
	registry := outbox.NewRegistry()
	if err := registry.Register("refund", declined, outbox.IdempotentByKey); err != nil {
		panic(err)
	}
	// The declines are logged at warn; this example keeps its output to
	// the listing.
	quiet := slog.New(slog.DiscardHandler)
	client, err := outbox.NewPgx(pool, outbox.Config{Schema: schema, Registry: registry, Logger: quiet})
	if err != nil {
		panic(err)
	}
	for step := range int64(3) {
		call := outbox.Call{RunID: "run_01J9Z", Step: step, Tool: "refund", Args: map[string]any{"order": 8840 + step}}
		if _, err := client.Do(ctx, call, nil); err != nil {
			panic(err)
		}
	}

	params := outbox.ListParams{States: []outbox.State{outbox.StateFailed}, Tool: "refund", Limit: 2}
	for page := 1; ; page++ {
		res, err := client.List(ctx, params)
		if err != nil {
			panic(err)
		}
		for _, k := range res.Keys {
			fmt.Printf("page %d: %s step %d %s\n", page, k.RunID, k.Step, k.State)
		}
		if res.Cursor == "" {
			break
		}
		params.Cursor = res.Cursor
	}

	// Output:
	// page 1: run_01J9Z step 0 failed
	// page 1: run_01J9Z step 1 failed
	// page 2: run_01J9Z step 2 failed
}

// ExampleClient_Cancel cancels a refund scheduled for later, before any
// dispatcher runs it: duplicates are told it was cancelled, and nothing
// runs. Retry sends it back to pending, due now.
func ExampleClient_Cancel() {
	ctx := context.Background()

	// A database and a migrated schema of the example's own, so that
	// examples running at once never meet; a service migrates "pgonce"
	// (the default) at start-up with migrations.Up.
	exampleDB, dropDB := exampledb.ForExample()
	defer dropDB()
	pool, schema := exampleDB.Pool, exampleDB.Schema

	refunds := outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
		return json.RawMessage(`{"refund_id":"re_1"}`), nil
	})
	registry := outbox.NewRegistry()
	if err := registry.Register("refund", refunds, outbox.IdempotentByKey); err != nil {
		panic(err)
	}
	client, err := outbox.NewPgx(pool, outbox.Config{Schema: schema, Registry: registry})
	if err != nil {
		panic(err)
	}

	// Submitted now, due in an hour; the metadata travels with the call
	// but is not part of its key.
	call := outbox.Call{
		RunID:    "run_01J9Z",
		Step:     1,
		Tool:     "refund",
		Args:     map[string]any{"order": 8842, "amount": "42.00"},
		Delay:    time.Hour,
		Metadata: map[string]string{"asked_by": "user-7"},
	}
	res, err := client.Submit(ctx, call)
	if err != nil {
		panic(err)
	}
	fmt.Printf("submitted: %s, due in about %s\n", res.State, res.RetryAfter.Round(time.Hour))

	res, err = client.Cancel(ctx, res.Key, outbox.CancelParams{By: "ops@example.com", Reason: "the customer withdrew"})
	if err != nil {
		panic(err)
	}
	fmt.Printf("cancelled: %s\n", res.State)

	dup, err := client.Do(ctx, call, nil)
	if err != nil {
		panic(err)
	}
	fmt.Printf("duplicate: %s\n", dup.Observation().JSON())

	// Cancelling again is refused and changes nothing.
	_, err = client.Cancel(ctx, res.Key, outbox.CancelParams{By: "ops@example.com", Reason: "again"})
	fmt.Printf("again: not cancellable=%t\n", errors.Is(err, outbox.ErrNotCancellable))

	res, err = client.Retry(ctx, res.Key, outbox.RetryParams{By: "ops@example.com", Reason: "the customer asked again"})
	if err != nil {
		panic(err)
	}
	fmt.Printf("retried: %s\n", res.State)
	done, err := client.Do(ctx, call, nil)
	if err != nil {
		panic(err)
	}
	fmt.Printf("ran: %s %s\n", done.State, done.Response)

	record, err := client.Inspect(ctx, res.Key)
	if err != nil {
		panic(err)
	}
	fmt.Printf("metadata: %v\n", record.Metadata)
	for _, r := range record.Resolutions {
		fmt.Printf("decision: %s by %s: %s\n", r.Action, r.By, r.Reason)
	}

	// Output:
	// submitted: pending, due in about 1h0m0s
	// cancelled: cancelled
	// duplicate: {"status":"cancelled","key":"k1_ba708f7aab40e1da2c4c93b8af00956babe38dff5045539b6180294f9587ab72","message":"an operator cancelled this action, so it did not run and will not run; do not ask for it again"}
	// again: not cancellable=true
	// retried: pending
	// ran: succeeded {"refund_id":"re_1"}
	// metadata: map[asked_by:user-7]
	// decision: cancel by ops@example.com: the customer withdrew
	// decision: retry by ops@example.com: the customer asked again
}

// ExampleClient_RunSteps reads an agent's run step by step, finished steps
// included: the tool calls as the model issued them.
func ExampleClient_RunSteps() {
	ctx := context.Background()

	// A database and a migrated schema of the example's own, so that
	// examples running at once never meet; a service migrates "pgonce"
	// (the default) at start-up with migrations.Up.
	exampleDB, dropDB := exampledb.ForExample()
	defer dropDB()
	pool, schema := exampleDB.Pool, exampleDB.Schema

	refunds := outbox.ProviderFunc(func(_ context.Context, req outbox.Request) (json.RawMessage, error) {
		return json.RawMessage(`{"refunded":` + string(req.Args) + `}`), nil
	})
	registry := outbox.NewRegistry()
	if err := registry.Register("refund", refunds, outbox.IdempotentByKey); err != nil {
		panic(err)
	}
	client, err := outbox.NewPgx(pool, outbox.Config{Schema: schema, Registry: registry})
	if err != nil {
		panic(err)
	}
	// Steps 0 and 1 ran; step 2 waits for a dispatcher.
	for step := range int64(3) {
		call := outbox.Call{RunID: "run_01J9Z", Step: step, Tool: "refund", Args: map[string]any{"order": 8840 + step}}
		if step < 2 {
			_, err = client.Do(ctx, call, nil)
		} else {
			_, err = client.Submit(ctx, call)
		}
		if err != nil {
			panic(err)
		}
	}

	res, err := client.RunSteps(ctx, outbox.RunParams{RunID: "run_01J9Z"})
	if err != nil {
		panic(err)
	}
	for _, s := range res.Steps {
		fmt.Printf("step %d %s %s %s\n", s.Step, s.Tool, s.State, s.Response)
	}

	// Output:
	// step 0 refund succeeded {"refunded":{"order":8840}}
	// step 1 refund succeeded {"refunded":{"order":8841}}
	// step 2 refund pending
}
