package toolcall_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgonce/pgonce/migrations"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/toolcall"
)

// ExampleExecutor runs a model's tool calls as a runtime without an adapter
// would: each call located by the run and its position in the run, never by
// the id the model gave it. Asked again, with the members re-ordered, the
// refund does not run again, and the model reads the same tool result.
func ExampleExecutor() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, cmp.Or(os.Getenv("PGONCE_TEST_DATABASE_URL"),
		"postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer func() { _ = db.Close() }()
	schema := "example_" + strings.ToLower(rand.Text())
	if err := migrations.Up(ctx, db, schema); err != nil {
		panic(err)
	}
	defer func() { _, _ = db.ExecContext(context.WithoutCancel(ctx), `DROP SCHEMA "`+schema+`" CASCADE`) }()

	refunds := 0
	registry := outbox.NewRegistry()
	if err := registry.Register("refund", outbox.ProviderFunc(func(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
		refunds++
		return json.RawMessage(`{"refund_id": "re_1"}`), nil
	}), outbox.IdempotentByKey); err != nil {
		panic(err)
	}
	client, err := outbox.NewPgx(pool, outbox.Config{Schema: schema, Registry: registry})
	if err != nil {
		panic(err)
	}
	exec, err := toolcall.NewExecutor(client, toolcall.Config{})
	if err != nil {
		panic(err)
	}

	// The run's earlier messages asked for 2 tool calls: this message's
	// first call is step 2.
	turn := toolcall.Turn{RunID: "run-8842", FirstStep: 2}
	asks := []toolcall.Call{
		turn.Call(0, "call_a1", "refund", `{"order": 8842, "amount": "42.00"}`),
		turn.Call(0, "call_b7", "refund", `{"amount": "42.00", "order": 8842}`), // asked again
		turn.Call(0, "call_c3", "refund", `{"order": 8842, "amount": `),         // cut off
	}
	for _, ask := range asks {
		out := exec.Run(ctx, ask)[0]
		fmt.Printf("%s step %d error=%t: %s\n", out.Call.ID, out.Call.Step, out.IsError(), out.Text())
	}
	fmt.Println("refunds:", refunds)
	// Output:
	// call_a1 step 2 error=false: {"status":"succeeded","key":"k1_b053528264f4182b7083b4917fc48d8af6e122ffad9cff82a711bd6df62a7d5c","response":{"refund_id": "re_1"}}
	// call_b7 step 2 error=false: {"status":"succeeded","key":"k1_b053528264f4182b7083b4917fc48d8af6e122ffad9cff82a711bd6df62a7d5c","response":{"refund_id": "re_1"}}
	// call_c3 step 2 error=true: {"status":"invalid_arguments","path":"$.amount","reason":"not JSON: unexpected end of input at offset 26","message":"the arguments cannot be used as they are (see path and reason), so nothing ran; correct them and ask again"}
	// refunds: 1
}
