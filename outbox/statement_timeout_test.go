package outbox_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

func TestStatementTimeout(t *testing.T) {
	t.Parallel()

	t.Run("DoClaimEndsOnAHalfOpenConnection", func(t *testing.T) {
		t.Parallel()
		schema := pgoncetest.Schema(t)
		provider := &countingProvider{response: json.RawMessage(`{"refund_id":"re_1"}`)}
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", provider, outbox.IdempotentByKey))
		proxy, pool := pgoncetest.NewBlackHoleProxy(t, 8)
		// The statement deadline ends a statement on the half-open
		// connection, and lies far beyond what a claim on a live one takes
		// on a loaded machine, a new connection's setup included: the last
		// Do below opens one.
		client, err := outbox.NewPgx(pool, outbox.Config{
			Schema: schema, Registry: registry, NotifyDisabled: true, StatementTimeout: 5 * time.Second,
		})
		require.NoError(t, err)
		_, err = client.Get(t.Context(), mustKey(t, refundCall("run-warm")))
		require.ErrorIs(t, err, outbox.ErrNotFound) // a connection in the pool

		proxy.BlackHole()
		done := make(chan error, 1)
		go func() {
			_, err := client.Do(t.Context(), refundCall("run-half-open"), nil)
			done <- err
		}()
		select {
		case err = <-done:
			require.Error(t, err, "the claim met the half-open connection")
		case <-time.After(time.Minute):
			t.Fatal("Do hangs on a half-open connection")
		}
		require.Zero(t, provider.calls.Load())

		res, err := client.Do(t.Context(), refundCall("run-half-open"), nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, res.State)
	})
}
