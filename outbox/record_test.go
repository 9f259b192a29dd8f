package outbox_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

func TestRecord(t *testing.T) {
	t.Parallel()

	t.Run("DoRecordsOutcomeAfterItsConnectionWasKilled", func(t *testing.T) {
		t.Parallel()
		schema := pgoncetest.Schema(t)
		pool, kill := pgoncetest.KillablePool(t)
		// The provider acts, and then the server kills every connection of
		// the client's pool: recording the outcome meets a dead one.
		var calls atomic.Int64
		provider := outbox.ProviderFunc(func(ctx context.Context, _ outbox.Request) (json.RawMessage, error) {
			calls.Add(1)
			return json.RawMessage(`{"sent":true}`), kill(ctx)
		})
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("email", provider, outbox.AtMostOnce))
		client, err := outbox.NewPgx(pool, outbox.Config{Schema: schema, Registry: registry, NotifyDisabled: true})
		require.NoError(t, err)

		call := refundCall("run-killed")
		call.Tool = "email"
		res, err := client.Do(t.Context(), call, nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, res.State)
		require.JSONEq(t, `{"sent":true}`, string(res.Response))

		again, err := client.Do(t.Context(), call, nil)
		require.NoError(t, err)
		require.True(t, again.Replayed())
		require.Equal(t, int64(1), calls.Load())
	})
}
