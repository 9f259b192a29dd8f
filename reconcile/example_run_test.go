package reconcile_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/exampledb"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/reconcile"
)

// ExampleReconciler_Run recovers from a worker that dies between the
// provider's effect and the record of its outcome. The refund happened,
// but the key stays in flight until its lease ends; the reconciler then
// puts it back to pending, the next dispatcher presents the same key, and
// the provider, which deduplicates on it, answers with the refund it made.
// One refund, one stored response.
func ExampleReconciler_Run() {
	ctx := context.Background()

	// A database and a migrated schema of the example's own, so that
	// examples running at once never meet; a service migrates "pgonce"
	// (the default) at start-up with migrations.Up.
	exampleDB, dropDB := exampledb.ForExample()
	defer dropDB()
	pool, schema := exampleDB.Pool, exampleDB.Schema

	// A payment provider that deduplicates on the key pgonce passes. Its
	// first response is lost: the worker dies while the call is running.
	var (
		mu      sync.Mutex
		refunds = map[outbox.Key]string{}
		acted   = make(chan struct{})
	)
	provider := outbox.ProviderFunc(func(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
		mu.Lock()
		id, seen := refunds[req.Key]
		if !seen {
			id = fmt.Sprintf("re_%d", len(refunds)+1)
			refunds[req.Key] = id
		}
		mu.Unlock()
		if !seen {
			fmt.Printf("attempt %d: refunded %s\n", req.Attempt, id)
			close(acted)
			<-ctx.Done() // the worker dies before the response arrives
			return nil, ctx.Err()
		}
		fmt.Printf("the same key again: already refunded as %s\n", id)
		return json.RawMessage(`{"refund_id":"` + id + `"}`), nil
	})
	registry := outbox.NewRegistry()
	if err := registry.Register("refund", provider, outbox.IdempotentByKey); err != nil {
		panic(err)
	}
	// A short lease, so that the example does not wait long for it to end.
	client, err := outbox.NewPgx(pool, outbox.Config{
		Schema:      schema,
		Registry:    registry,
		CallTimeout: 100 * time.Millisecond,
		Lease:       1100 * time.Millisecond,
	})
	if err != nil {
		panic(err)
	}
	res, err := client.Submit(ctx, outbox.Call{
		RunID: "run_01J9Z",
		Step:  3,
		Tool:  "refund",
		Args:  map[string]any{"order": 8842, "amount": "42.00"},
	})
	if err != nil {
		panic(err)
	}

	// The first worker dies mid-call: a dispatcher cut off at once
	// records nothing, and the key stays in flight under its lease.
	crashed, err := dispatcher.New(client, dispatcher.Config{
		ShutdownTimeout: -1,
		Logger:          slog.New(slog.DiscardHandler), // its warning is the point
	})
	if err != nil {
		panic(err)
	}
	crashCtx, crash := context.WithCancel(ctx)
	crashedDone := make(chan error, 1)
	go func() { crashedDone <- crashed.Run(crashCtx) }()
	<-acted
	crash()
	if err := <-crashedDone; err != nil {
		panic(err)
	}

	// The service's reconciler and a new dispatcher, until shutdown.
	r, err := reconcile.New(client, reconcile.Config{Grace: 100 * time.Millisecond})
	if err != nil {
		panic(err)
	}
	d, err := dispatcher.New(client, dispatcher.Config{})
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	var running sync.WaitGroup
	running.Go(func() { _ = r.Run(runCtx, 100*time.Millisecond) })
	running.Go(func() { _ = d.Run(runCtx) })

	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err = client.Wait(waitCtx, res.Key)
	if err != nil {
		panic(err)
	}
	fmt.Printf("state=%s response=%s\n", res.State, res.Response)

	stop()
	running.Wait() // both have returned: the pool may close

	// Output:
	// attempt 1: refunded re_1
	// the same key again: already refunded as re_1
	// state=succeeded response={"refund_id":"re_1"}
}
