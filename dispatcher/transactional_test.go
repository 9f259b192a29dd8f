package dispatcher_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
)

func TestDispatcherTransactional(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testDispatcherTransactional[pgx.Tx], testDispatcherTransactional[*sql.Tx])
}

func testDispatcherTransactional[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()

	t.Run("EveryKeyWritesItsEffectOnce", func(t *testing.T) {
		t.Parallel()
		schema := pgoncetest.Schema(t)
		table := pgoncetest.EffectTable(t, schema)
		// Every key's first attempt writes its effect and then fails: the
		// transaction rolls the effect back, and the retry writes it once.
		provider := drivertest.EffectProvider[TTx](table, func(_ context.Context, req outbox.Request) (json.RawMessage, error) {
			if req.Attempt == 1 {
				return nil, errors.New("first attempt fails after its effect")
			}
			return json.RawMessage(`{"credited":true}`), nil
		})
		registry := outbox.NewRegistry()
		require.NoError(t, outbox.RegisterTx(registry, "credit", provider, nil))
		client := driver.Client(t, outbox.Config{Schema: schema, Registry: registry})
		config := fastConfig()
		config.Concurrency = 8
		d, err := dispatcher.New(client, config)
		require.NoError(t, err)
		start(t, d)

		keys := make([]outbox.Key, 0, 40)
		for step := range int64(40) {
			keys = append(keys, submit(t, client, "credit", step+1))
		}
		for _, key := range keys {
			res := awaitState(t, client, key, outbox.StateSucceeded)
			require.Equal(t, 2, res.Attempts)
			require.JSONEq(t, `{"credited":true}`, string(res.Response))
			require.Equal(t, 1, pgoncetest.CountEffects(t, table, key), "key %s", key)
		}
	})
}
