package outbox_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgonce/pgonce/migrations"
	"github.com/pgonce/pgonce/outbox"
)

// ExampleClient_Resolve settles a key that nobody could make certain: an
// at-most-once e-mail whose send timed out may or may not have gone out,
// so pgonce sends it to review instead of sending it twice. An operator
// who checked the mail log records what happened; the decision is kept
// with who made it and why, and duplicates replay it.
func ExampleClient_Resolve() {
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
