package dispatcher_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"runtime"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
)

// TestCallsRunOnAPoolOfWorkers checks that the dispatcher runs its calls on
// at most Concurrency goroutines, each running call after call, rather
// than on a goroutine per call: a worker's stack has grown already when its
// next call comes.
func TestCallsRunOnAPoolOfWorkers(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testCallsRunOnAPoolOfWorkers[pgx.Tx], testCallsRunOnAPoolOfWorkers[*sql.Tx])
}

func testCallsRunOnAPoolOfWorkers[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()
	bundle := setup(t, driver)
	var (
		mu         sync.Mutex
		goroutines = map[string]int{}
	)
	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("refund", outbox.ProviderFunc(func(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
		mu.Lock()
		goroutines[goroutineID()]++
		mu.Unlock()
		return bundle.ledger.Call(ctx, req)
	}), outbox.IdempotentByKey))
	client := bundle.clientWith(t, registry)

	const calls, concurrency = 60, 3
	keys := bundle.submitAll(t, client, callsFrom("refund", 0, calls))
	config := fastConfig()
	config.Concurrency, config.BatchSize = concurrency, concurrency
	d, err := dispatcher.New(client, config)
	require.NoError(t, err)
	start(t, d)
	for _, key := range keys {
		awaitState(t, client, key, outbox.StateSucceeded)
	}

	mu.Lock()
	defer mu.Unlock()
	ran := 0
	for _, n := range goroutines {
		ran += n
	}
	require.GreaterOrEqual(t, ran, calls, "every key was called")
	require.LessOrEqual(t, len(goroutines), concurrency,
		"%d calls ran on %d goroutines: more than Concurrency", ran, len(goroutines))
}

// goroutineID is the id of the calling goroutine, from the first line of
// its stack trace ("goroutine 42 [running]:").
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	id, _, _ := bytes.Cut(bytes.TrimPrefix(buf, []byte("goroutine ")), []byte(" "))
	return string(id)
}
