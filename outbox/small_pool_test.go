package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
)

// smallPoolWait is the deadline of each request of TestSmallPool. The
// report's service waited 4s for results that its dispatcher, in the same
// process over a pool of two connections, took 8s to deliver.
const smallPoolWait = 5 * time.Second

// smallPoolProviderLatency is how long the provider of TestSmallPool takes.
// A wait that cannot listen and backs its re-reads off to 2s reads at 50ms,
// 150ms, ... 3.15s, 5.15s: it sees such a result only after smallPoolWait.
const smallPoolProviderLatency = 3300 * time.Millisecond

// TestSmallPool is that report's service: a pool of two connections shared
// by a dispatcher and many requests that each submit a call and wait for
// its result. Every request gets its result within its wait, and the
// dispatcher warns that the pool is smaller than it needs. It runs over
// direct connections only: behind a transaction pooler the dispatcher's
// listener has a direct connection of its own, and never shares the pool.
func TestSmallPool(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testSmallPool[pgx.Tx], testSmallPool[*sql.Tx])
}

func testSmallPool[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()
	schema := pgoncetest.Schema(t)
	config, err := pgxpool.ParseConfig(pgoncetest.DatabaseURL(t))
	require.NoError(t, err)
	config.ConnConfig.RuntimeParams["search_path"] = ""
	config.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(t.Context(), config)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	// A provider as slow as the report's: its results arrive more than half
	// a wait after the request.
	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("email", outbox.ProviderFunc(func(ctx context.Context, _ outbox.Request) (json.RawMessage, error) {
		select {
		case <-time.After(smallPoolProviderLatency):
			return json.RawMessage(`{"sent":true}`), nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}), outbox.IdempotentByKey))
	logs := &logRecorder{}
	client := driver.ClientOver(t, pool, outbox.Config{Schema: schema, Registry: registry, Logger: slog.New(logs)})

	d, err := dispatcher.New(client, dispatcher.Config{})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(context.WithoutCancel(t.Context()))
	ran := make(chan error, 1)
	go func() { ran <- d.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		select {
		case err := <-ran:
			require.NoError(t, err)
		case <-time.After(time.Minute):
			t.Error("Dispatcher.Run over two connections did not return after it was stopped")
		}
	})

	const requests = 16
	var wg sync.WaitGroup
	errs := make(chan error, requests)
	took := make(chan time.Duration, requests)
	for i := range requests {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), smallPoolWait)
			defer cancel()
			began := time.Now()
			res, err := client.Submit(ctx, outbox.Call{RunID: "req", Step: int64(i), Tool: "email", Args: map[string]any{"n": i}})
			if err != nil {
				errs <- fmt.Errorf("request %d: submit: %w", i, err)
				return
			}
			res, err = client.Wait(ctx, res.Key)
			if err != nil {
				errs <- fmt.Errorf("request %d: wait: %w (last state %s)", i, err, res.State)
				return
			}
			if res.State != outbox.StateSucceeded {
				errs <- fmt.Errorf("request %d: state %s", i, res.State)
				return
			}
			took <- time.Since(began)
		})
	}
	wg.Wait()
	close(errs)
	close(took)
	for err := range errs {
		t.Error(err)
	}
	var slowest time.Duration
	for d := range took {
		slowest = max(slowest, d)
	}
	t.Logf("slowest request over two connections: %s", slowest)
	require.True(t, logs.contains("pool is smaller than a dispatcher and waits in one process need"),
		"the dispatcher warns that the pool is small: %v", logs.messages)
}
