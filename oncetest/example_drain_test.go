package oncetest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/pgonce/pgonce/internal/exampledb"
	"github.com/pgonce/pgonce/oncetest"
	"github.com/pgonce/pgonce/outbox"
)

// ExampleDrain runs submitted calls synchronously, as a test of a service
// would: no dispatcher, no waiting. A call that fails is retried after its
// backoff, by the fake clock. In a test, oncetest.Schema(t, db) makes and
// drops the schema, and RequireCalledOnce checks the recorder.
func ExampleDrain() {
	ctx := context.Background()

	// A database and a migrated schema of the example's own, so that
	// examples running at once never meet; a service migrates "pgonce"
	// (the default) at start-up with migrations.Up.
	exampleDB, dropDB := exampledb.ForExample()
	defer dropDB()
	pool, schema := exampleDB.Pool, exampleDB.Schema

	// The provider is down for its first call.
	down := true
	refunds := &oncetest.Recorder{}
	refunds.RespondFunc = func(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
		if down {
			down = false
			return nil, errors.New("503 Service Unavailable")
		}
		return json.RawMessage(`{"refund_id":"re_1"}`), nil
	}
	registry := outbox.NewRegistry()
	if err := registry.Register("refund", refunds, outbox.IdempotentByKey); err != nil {
		panic(err)
	}
	clock := oncetest.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	client, err := outbox.NewPgx(pool, outbox.Config{Schema: schema, Registry: registry, NowFunc: clock.Now})
	if err != nil {
		panic(err)
	}

	call := outbox.Call{RunID: "run_01J9Z", Step: 3, Tool: "refund", Args: map[string]any{"order": 8842, "amount": "42.00"}}
	for range 2 { // the same refund, asked for twice
		if _, err := client.Submit(ctx, call); err != nil {
			panic(err)
		}
	}

	res, err := oncetest.Drain(ctx, client, nil)
	if err != nil {
		panic(err)
	}
	fmt.Printf("first drain:  attempts=%d retried=%d\n", res.Attempts(), res.Retried)

	clock.Advance(time.Second) // past the first backoff
	res, err = oncetest.Drain(ctx, client, nil)
	if err != nil {
		panic(err)
	}
	fmt.Printf("second drain: attempts=%d succeeded=%d\n", res.Attempts(), res.Succeeded)

	got, err := client.Get(ctx, res.Keys[0])
	if err != nil {
		panic(err)
	}
	fmt.Printf("state=%s response=%s provider calls=%d\n", got.State, got.Response, len(refunds.Calls()))

	// Output:
	// first drain:  attempts=1 retried=1
	// second drain: attempts=1 succeeded=1
	// state=succeeded response={"refund_id":"re_1"} provider calls=2
}
