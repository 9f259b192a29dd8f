package dispatcher_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
)

// outcomeLog records the outcomes a middleware sees, by attempt.
type outcomeLog struct {
	mu       sync.Mutex
	outcomes []outbox.ProviderOutcome
	attempts []int
}

func (l *outcomeLog) AroundProvider(ctx context.Context, call *outbox.ProviderCall, next func(ctx context.Context) outbox.ProviderResult) outbox.ProviderResult {
	res := next(ctx)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.outcomes = append(l.outcomes, res.Outcome)
	l.attempts = append(l.attempts, call.Request.Attempt)
	return res
}

func (l *outcomeLog) seen() ([]outbox.ProviderOutcome, []int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]outbox.ProviderOutcome(nil), l.outcomes...), append([]int(nil), l.attempts...)
}

func TestDispatcherRunsMiddleware(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testDispatcherRunsMiddleware[pgx.Tx], testDispatcherRunsMiddleware[*sql.Tx])
}

func testDispatcherRunsMiddleware[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()

	t.Run("SeesRetriesThenSuccess", func(t *testing.T) {
		t.Parallel()
		log := &outcomeLog{}
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", outbox.ProviderFunc(func(_ context.Context, req outbox.Request) (json.RawMessage, error) {
			if req.Attempt < 3 {
				return nil, errors.New("503 upstream")
			}
			return json.RawMessage(`{}`), nil
		}), outbox.IdempotentByKey))
		client := driver.Client(t, outbox.Config{Schema: pgoncetest.Schema(t), Registry: registry, Middleware: []outbox.Middleware{log}})
		d, err := dispatcher.New(client, fastConfig())
		require.NoError(t, err)
		start(t, d)

		key := submit(t, client, "refund", 1)
		awaitState(t, client, key, outbox.StateSucceeded)
		outcomes, attempts := log.seen()
		require.Equal(t, []outbox.ProviderOutcome{outbox.ProviderRetry, outbox.ProviderRetry, outbox.ProviderSucceeded}, outcomes)
		require.Equal(t, []int{1, 2, 3}, attempts)
	})

	t.Run("SeesTheGiveUpAtTheAttemptLimit", func(t *testing.T) {
		t.Parallel()
		log := &outcomeLog{}
		registry := outbox.NewRegistry()
		require.NoError(t, registry.RegisterWithOpts("refund", outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
			return nil, errors.New("503 upstream")
		}), outbox.IdempotentByKey, &outbox.ToolOpts{Middleware: []outbox.Middleware{log}}))
		client := driver.Client(t, outbox.Config{Schema: pgoncetest.Schema(t), Registry: registry})
		config := fastConfig()
		config.MaxAttempts = 2
		d, err := dispatcher.New(client, config)
		require.NoError(t, err)
		start(t, d)

		key := submit(t, client, "refund", 1)
		awaitState(t, client, key, outbox.StateFailed)
		outcomes, _ := log.seen()
		require.Equal(t, []outbox.ProviderOutcome{outbox.ProviderRetry, outbox.ProviderFailed}, outcomes)
	})
}
