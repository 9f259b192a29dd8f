package outbox_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

func TestDatabaseClock(t *testing.T) {
	t.Parallel()

	t.Run("RetryAfterIsMeasuredOnTheDatabaseClock", func(t *testing.T) {
		t.Parallel()
		schema := pgoncetest.Schema(t)
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", &countingProvider{}, outbox.IdempotentByKey))
		// The database's clock is an hour ahead of this process's: a key due
		// now by the database's clock is due now, not in an hour.
		client, err := outbox.NewPgx(pgoncetest.ShiftedClockPool(t, time.Hour), outbox.Config{Schema: schema, Registry: registry})
		require.NoError(t, err)

		res, err := client.Submit(t.Context(), refundCall("run-clock"))
		require.NoError(t, err)
		require.Less(t, res.RetryAfter, time.Second)

		got, err := client.Get(t.Context(), res.Key)
		require.NoError(t, err)
		require.Equal(t, outbox.StatePending, got.State)
		require.Less(t, got.RetryAfter, time.Second)
	})
}
