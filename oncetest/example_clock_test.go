package oncetest_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgonce/pgonce/internal/exampledb"
	"github.com/pgonce/pgonce/oncetest"
	"github.com/pgonce/pgonce/outbox"
)

// ExampleClock tests retention without waiting for it: a Clock as the
// client's NowFunc, Drain to run the due call, and the clock moved 31 days
// on. Pruned, the refund's key is a tombstone: asked again, the refund is
// not run a second time, and the caller learns when it was.
func ExampleClock() {
	ctx := context.Background()
	// A database and a migrated schema of the example's own (see
	// ExampleDrain); a test uses oncetest.Schema.
	exampleDB, dropDB := exampledb.ForExample()
	defer dropDB()
	pool, schema := exampleDB.Pool, exampleDB.Schema

	clock := oncetest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	refunds := &oncetest.Recorder{}
	registry := outbox.NewRegistry()
	if err := registry.Register("refund", refunds, outbox.IdempotentByKey); err != nil {
		panic(err)
	}
	client, err := outbox.NewPgx(pool, outbox.Config{Schema: schema, Registry: registry, NowFunc: clock.Now})
	if err != nil {
		panic(err)
	}
	call := outbox.Call{RunID: "run-8842", Step: 1, Tool: "refund", Args: map[string]any{"order": 8842, "amount": "42.00"}}
	if _, err := client.Submit(ctx, call); err != nil {
		panic(err)
	}
	if _, err := oncetest.Drain(ctx, client, nil); err != nil {
		panic(err)
	}

	clock.Advance(outbox.RetentionDefault + 24*time.Hour)
	pruned, err := client.Prune(ctx, nil)
	if err != nil {
		panic(err)
	}
	fmt.Println("keys turned into tombstones:", pruned.Keys)

	res, err := client.Submit(ctx, call)
	fmt.Println("asked again, expired:", errors.Is(err, outbox.ErrExpired), "completed", res.CompletedAt.Format(time.DateOnly))
	fmt.Println("provider calls:", len(refunds.Calls()))

	// Output:
	// keys turned into tombstones: 1
	// asked again, expired: true completed 2026-01-02
	// provider calls: 1
}
