package reconcile_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/reconcile"
)

// TestStoredToolSettings shows that the reconciler resolves a key by the
// delivery mode and provider key retention stored with it at submit, not
// by how its own registry (the CLI's placeholders, say) names the tool.
func TestStoredToolSettings(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testStoredToolSettings[pgx.Tx], testStoredToolSettings[*sql.Tx])
}

func testStoredToolSettings[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	errPlaceholder := errors.New("placeholder: never called")
	placeholder := outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
		return nil, errPlaceholder
	})
	// reconcileAs runs one reconciler pass over schema with a registry that
	// names tool as keyed, without options, as `pgonce reconcile --keyed`
	// does, and returns key's state after it.
	reconcileAs := func(t *testing.T, schema, tool string, key outbox.Key) outbox.Inspection {
		t.Helper()
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register(tool, placeholder, outbox.IdempotentByKey))
		client := driver.Client(t, outbox.Config{Schema: schema, Registry: registry})
		r, err := reconcile.New(client, reconcile.Config{Grace: time.Second, PruneDisabled: true})
		require.NoError(t, err)
		_, err = r.RunOnce(t.Context())
		require.NoError(t, err)
		inspection, err := client.Inspect(t.Context(), key)
		require.NoError(t, err)
		return inspection
	}
	submitAbandoned := func(t *testing.T, schema, tool string, delivery outbox.Delivery, opts *outbox.ToolOpts) outbox.Key {
		t.Helper()
		registry := outbox.NewRegistry()
		require.NoError(t, registry.RegisterWithOpts(tool, &payments{effects: map[string]int{}}, delivery, opts))
		service := driver.Client(t, outbox.Config{Schema: schema, Registry: registry})
		res, err := service.Submit(t.Context(), call(tool, 1))
		require.NoError(t, err)
		inspection, err := service.Inspect(t.Context(), res.Key)
		require.NoError(t, err)
		require.Equal(t, delivery, inspection.Delivery, "the delivery is stored at submit")
		if opts != nil {
			require.Equal(t, opts.KeyRetention, inspection.KeyRetention, "the key retention is stored at submit")
		}
		// First attempted a minute and a half ago, its lease ended 30s ago.
		pgoncetest.AbandonKeys(t, schema, 30*time.Second, res.Key)
		return res.Key
	}

	t.Run("KeyRetentionComesFromTheKey", func(t *testing.T) {
		t.Parallel()
		schema := pgoncetest.Schema(t)
		key := submitAbandoned(t, schema, "refund", outbox.IdempotentByKey, &outbox.ToolOpts{KeyRetention: time.Minute})
		inspection := reconcileAs(t, schema, "refund", key)
		require.Equal(t, outbox.StateNeedsReview, inspection.State,
			"the provider forgot the key a minute after the first attempt: a retry by key could act twice")
	})

	t.Run("WithinKeyRetentionRequeues", func(t *testing.T) {
		t.Parallel()
		schema := pgoncetest.Schema(t)
		key := submitAbandoned(t, schema, "refund", outbox.IdempotentByKey, &outbox.ToolOpts{KeyRetention: time.Hour})
		inspection := reconcileAs(t, schema, "refund", key)
		require.Equal(t, outbox.StatePending, inspection.State)
	})

	t.Run("DeliveryComesFromTheKey", func(t *testing.T) {
		t.Parallel()
		schema := pgoncetest.Schema(t)
		key := submitAbandoned(t, schema, "email", outbox.AtMostOnce, nil)
		inspection := reconcileAs(t, schema, "email", key)
		require.Equal(t, outbox.StateNeedsReview, inspection.State, "an at-most-once key is never retried blindly")
	})

	t.Run("LookupKeyGoesBackForItsServiceToLookUp", func(t *testing.T) {
		t.Parallel()
		schema := pgoncetest.Schema(t)
		key := submitAbandoned(t, schema, "provision", outbox.LookupByNaturalID, nil)
		inspection := reconcileAs(t, schema, "provision", key)
		require.Equal(t, outbox.StatePending, inspection.State)
		require.NotNil(t, inspection.Queue)
		require.True(t, inspection.Queue.Ambiguous, "the next attempt looks up before it calls")
	})
}
