package dispatcher_test

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

// ExampleConfig_development runs a service under the development preset,
// the four settings with which a call cut off by a crash is recovered
// within seconds instead of two minutes: the client's CallTimeout and
// Lease, the dispatcher's MaintenanceInterval and its reconciler's Grace.
// A worker dies while the payment API refunds; the next dispatcher's
// maintenance puts the key back to pending once the lease and the grace
// have passed, and presents the same key again. For a developer's machine
// and tests only: production keeps the defaults.
func ExampleConfig_development() {
	ctx := context.Background()
	// A database and a migrated schema of the example's own (see
	// ExampleDispatcher_Run).
	exampleDB, dropDB := exampledb.ForExample()
	defer dropDB()
	pool, schema := exampleDB.Pool, exampleDB.Schema

	// A payment API that deduplicates on the key; the first worker dies
	// while it answers.
	var (
		mu      sync.Mutex
		refunds = map[outbox.Key]int{}
		acted   = make(chan struct{}, 1)
	)
	payments := outbox.ProviderFunc(func(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
		mu.Lock()
		refunds[req.Key]++
		first := refunds[req.Key] == 1
		mu.Unlock()
		if first {
			acted <- struct{}{}
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return json.RawMessage(`{"refund_id":"re_1"}`), nil
	})
	registry := outbox.NewRegistry()
	if err := registry.Register("refund", payments, outbox.IdempotentByKey); err != nil {
		panic(err)
	}

	// The development preset.
	client, err := outbox.NewPgx(pool, outbox.Config{
		Schema:      schema,
		Registry:    registry,
		CallTimeout: outbox.CallTimeoutDevelopment, // 2s
		Lease:       outbox.LeaseDevelopment,       // 3s
		Logger:      slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	config := dispatcher.Config{
		MaintenanceInterval: dispatcher.MaintenanceIntervalDevelopment,                     // 1s
		Reconcile:           dispatcher.ReconcileConfig{Grace: reconcile.GraceDevelopment}, // 1s
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

	// The first worker dies mid-call: cut off at once, it records nothing.
	dying := config
	dying.ShutdownTimeout = -1
	run := func(config dispatcher.Config) (stop func()) {
		d, err := dispatcher.New(client, config)
		if err != nil {
			panic(err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = d.Run(runCtx)
		}()
		return func() { cancel(); <-done }
	}
	stopDying := run(dying)
	<-acted
	stopDying()
	res, err = client.Get(ctx, res.Key)
	if err != nil {
		panic(err)
	}
	fmt.Println("after the crash:", res.State)

	// The next worker recovers it within the preset's bound.
	stop := run(config)
	defer stop()
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	res, err = client.Wait(waitCtx, res.Key)
	if err != nil {
		panic(err)
	}
	fmt.Printf("recovered: %s after %d attempts, %s\n", res.State, res.Attempts, res.Response)
	mu.Lock()
	defer mu.Unlock()
	fmt.Println("refund requests with its key:", refunds[res.Key])

	// Output:
	// after the crash: in_flight
	// recovered: succeeded after 3 attempts, {"refund_id":"re_1"}
	// refund requests with its key: 2
}
