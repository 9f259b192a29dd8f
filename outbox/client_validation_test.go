package outbox_test

import (
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/outbox"
)

func TestSubmitTxRefusesNilTransaction(t *testing.T) {
	t.Parallel()

	setup := func(t *testing.T) (outbox.Config, string) {
		t.Helper()
		config := refundConfig(t)
		return config, config.Schema
	}

	t.Run("Pgx", func(t *testing.T) {
		t.Parallel()
		config, schema := setup(t)
		client := pgxHarness().newClient(t, config)
		before := tableHashes(t, schema)
		for _, tx := range []pgx.Tx{nil, (*pgxpool.Tx)(nil)} {
			_, err := client.SubmitTx(t.Context(), tx, refundCall("run-nil"))
			require.ErrorIs(t, err, outbox.ErrInvalidTx)
		}
		require.Equal(t, before, tableHashes(t, schema))
	})
	t.Run("DatabaseSQL", func(t *testing.T) {
		t.Parallel()
		config, schema := setup(t)
		client := stdHarness().newClient(t, config)
		before := tableHashes(t, schema)
		_, err := client.SubmitTx(t.Context(), nil, refundCall("run-nil"))
		require.ErrorIs(t, err, outbox.ErrInvalidTx)
		require.Equal(t, before, tableHashes(t, schema))
	})
}

func TestClientRefusesNULBeforeSQL(t *testing.T) {
	t.Parallel()
	eachHarness(t, testClientRefusesNULBeforeSQL[pgx.Tx], testClientRefusesNULBeforeSQL[*sql.Tx])
}

func testClientRefusesNULBeforeSQL[TTx any](t *testing.T, h driverHarness[TTx]) {
	t.Helper()

	setup := func(t *testing.T) (*outbox.Client[TTx], string) {
		t.Helper()
		config := refundConfig(t)
		return h.newClient(t, config), config.Schema
	}

	for _, tt := range []struct {
		name   string
		mutate func(*outbox.Call)
	}{
		{"Tenant", func(c *outbox.Call) { c.Tenant = "acme\x00" }},
		{"RunID", func(c *outbox.Call) { c.RunID = "run\x00" }},
		{"Key", func(c *outbox.Call) { c.Key = "\x00order" }},
		{"NaturalID", func(c *outbox.Call) { c.NaturalID = "vm-\x0042" }},
	} {
		t.Run("SubmitTxKeepsTransactionWithNULIn"+tt.name, func(t *testing.T) {
			t.Parallel()
			client, schema := setup(t)
			before := tableHashes(t, schema)

			call := refundCall("run-nul")
			tt.mutate(&call)
			tx := h.begin(t, nil)
			_, err := client.SubmitTx(t.Context(), tx, call)
			require.ErrorIs(t, err, outbox.ErrInvalidCall)
			require.NoError(t, h.exec(tx, "SELECT 1"))
			require.NoError(t, h.commit(tx))
			require.Equal(t, before, tableHashes(t, schema))
		})
	}

	for _, tt := range []struct {
		name       string
		resolution outbox.Resolution
	}{
		{"By", outbox.Resolution{Action: outbox.ResolveRetry, By: "ops\x00", Reason: "checked"}},
		{"Reason", outbox.Resolution{Action: outbox.ResolveRetry, By: "ops", Reason: "checked\x00"}},
		{"ByInvalidUTF8", outbox.Resolution{Action: outbox.ResolveRetry, By: "ops\xff", Reason: "checked"}},
		{"ReasonInvalidUTF8", outbox.Resolution{Action: outbox.ResolveRetry, By: "ops", Reason: "\xffchecked"}},
	} {
		t.Run("ResolveRefuses"+tt.name, func(t *testing.T) {
			t.Parallel()
			client, schema := setup(t)
			key := needsReviewKey(t, client, schema, refundCall("run-review"))
			before := tableHashes(t, schema)

			_, err := client.Resolve(t.Context(), key, tt.resolution)
			require.ErrorIs(t, err, outbox.ErrInvalidResolution)
			require.Equal(t, before, tableHashes(t, schema))
		})
	}
}
