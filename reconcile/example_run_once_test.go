package reconcile_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/pgonce/pgonce/internal/exampledb"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/reconcile"
)

// mailLog is a mailer without keys whose log can be searched by
// Message-ID: it already holds the receipt that the abandoned attempt sent.
type mailLog struct{ outbox.ProviderFunc }

func (mailLog) Lookup(_ context.Context, req outbox.Request) (json.RawMessage, bool, error) {
	return json.RawMessage(`{"queued_as":"q-1"}`), req.NaturalID == "<receipt-8842@shop.example>", nil
}

// ExampleReconciler_RunOnce is a scheduled reconcile (a cron job, `pgonce
// reconcile --once`): it finds three attempts that a dead worker left in
// flight, and resolves each by its tool's delivery, without calling a
// provider: the keyed refund goes back to pending, for a dispatcher to
// present the same key again; the receipt, looked up by its Message-ID, is
// found and recorded; the notification, which can neither be deduplicated
// nor looked up, goes to review. The dead worker's claims are dated two
// minutes back, past their lease and the grace, instead of waiting for them
// to expire.
func ExampleReconciler_RunOnce() {
	ctx := context.Background()
	// A database and a migrated schema of the example's own (see
	// ExampleReconciler_Run).
	exampleDB, dropDB := exampledb.ForExample()
	defer dropDB()
	pool, schema := exampleDB.Pool, exampleDB.Schema

	never := outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
		panic("the reconciler never calls a provider")
	})
	registry := outbox.NewRegistry()
	for tool, delivery := range map[string]outbox.Delivery{
		"refund":  outbox.IdempotentByKey,
		"notify":  outbox.AtMostOnce,
		"receipt": outbox.LookupByNaturalID,
	} {
		var provider outbox.Provider = never
		if delivery == outbox.LookupByNaturalID {
			provider = mailLog{never}
		}
		if err := registry.Register(tool, provider, delivery); err != nil {
			panic(err)
		}
	}
	quiet := slog.New(slog.DiscardHandler)
	client, err := outbox.NewPgx(pool, outbox.Config{Schema: schema, Registry: registry, Logger: quiet})
	if err != nil {
		panic(err)
	}

	// Two minutes ago a worker claimed three calls, and died before it
	// recorded anything.
	twoMinutesAgo := func() time.Time { return time.Now().Add(-2 * time.Minute) }
	dead, err := outbox.NewPgx(pool, outbox.Config{Schema: schema, Registry: registry, NowFunc: twoMinutesAgo, Logger: quiet})
	if err != nil {
		panic(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	keys := map[outbox.Key]string{}
	for step, tool := range []string{"refund", "receipt", "notify"} {
		res, err := dead.ClaimTx(ctx, tx, outbox.Call{
			RunID:     "run-8842",
			Step:      int64(step + 1),
			Tool:      tool,
			Args:      map[string]any{"order": 8842},
			NaturalID: "<receipt-8842@shop.example>",
		})
		if err != nil {
			panic(err)
		}
		keys[res.Key] = tool
	}
	if err := tx.Commit(ctx); err != nil {
		panic(err)
	}

	r, err := reconcile.New(client, reconcile.Config{Grace: reconcile.GraceDefault})
	if err != nil {
		panic(err)
	}
	report, err := r.RunOnce(ctx)
	if err != nil {
		panic(err)
	}
	for _, tool := range []string{"refund", "receipt", "notify"} {
		for outcome, n := range report.Resolved[tool] {
			fmt.Printf("%-8s %s: %d\n", tool, outcome, n)
		}
	}
	for key, tool := range keys {
		res, err := client.Get(ctx, key)
		if err != nil {
			panic(err)
		}
		if tool == "receipt" {
			fmt.Printf("receipt  now %s, response %s\n", res.State, res.Response)
		}
	}

	// Output:
	// refund   requeued: 1
	// receipt  found: 1
	// notify   needs_review: 1
	// receipt  now succeeded, response {"queued_as":"q-1"}
}
