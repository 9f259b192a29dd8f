package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/pgonce/pgonce/internal/exampledb"
	"github.com/pgonce/pgonce/outbox"
)

// ExampleClient_Resolve settles a key that nobody could make certain: an
// at-most-once e-mail whose send timed out may or may not have gone out,
// so pgonce sends it to review instead of sending it twice. An operator
// who checked the mail log records what happened; the decision is kept
// with who made it and why, and duplicates replay it.
func ExampleClient_Resolve() {
	ctx := context.Background()

	// A database and a migrated schema of the example's own, so that
	// examples running at once never meet; a service migrates "pgonce"
	// (the default) at start-up with migrations.Up.
	exampleDB, dropDB := exampledb.ForExample()
	defer dropDB()
	pool, schema := exampleDB.Pool, exampleDB.Schema

	// The mail server timed out after the message was sent, or before.
	mailer := outbox.ProviderFunc(func(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
		return nil, outbox.Ambiguous(errors.New("smtp: timeout after DATA"))
	})
	registry := outbox.NewRegistry()
	if err := registry.Register("email", mailer, outbox.AtMostOnce); err != nil {
		panic(err)
	}
	client, err := outbox.NewPgx(pool, outbox.Config{Schema: schema, Registry: registry})
	if err != nil {
		panic(err)
	}

	call := outbox.Call{
		RunID: "run_01J9Z",
		Step:  4,
		Tool:  "email",
		Args:  map[string]any{"to": "customer@example.com", "template": "refund_sent"},
	}
	res, err := client.Do(ctx, call, nil)
	if err != nil {
		panic(err)
	}
	fmt.Printf("after the timeout: %s\n", res.State)

	// An operator resolves it: ResolveSucceeded with the response to
	// replay, ResolveFailed with a failure, or ResolveRetry to send again.
	res, err = client.Resolve(ctx, res.Key, outbox.Resolution{
		Action:   outbox.ResolveSucceeded,
		Response: json.RawMessage(`{"sent":true}`),
		By:       "ops@example.com",
		Reason:   "the mail log shows delivery",
	})
	if err != nil {
		panic(err)
	}
	fmt.Printf("resolved: %s %s\n", res.State, res.Response)

	// Resolving again is refused and changes nothing.
	_, err = client.Resolve(ctx, res.Key, outbox.Resolution{Action: outbox.ResolveRetry, By: "ops@example.com", Reason: "again"})
	fmt.Printf("again: not in review=%t\n", errors.Is(err, outbox.ErrNotNeedsReview))

	// A duplicate replays the decision; nothing is sent.
	dup, err := client.Submit(ctx, call)
	if err != nil {
		panic(err)
	}
	fmt.Printf("duplicate: %s %s\n", dup.State, dup.Response)

	record, err := client.Inspect(ctx, res.Key)
	if err != nil {
		panic(err)
	}
	for _, r := range record.Resolutions {
		fmt.Printf("decision: %s by %s: %s\n", r.Action, r.By, r.Reason)
	}

	// Output:
	// after the timeout: needs_review
	// resolved: succeeded {"sent":true}
	// again: not in review=true
	// duplicate: succeeded {"sent":true}
	// decision: succeeded by ops@example.com: the mail log shows delivery
}
