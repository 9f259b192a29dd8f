package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/migrations"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/reconcile"
)

// TestNotMigrated covers a schema that does not exist, one without tables,
// and one migrated by an older build: every operation returns an error
// matching ErrNotMigrated that names the schema, both versions and the fix,
// and CheckSchema says so before any operation, writing nothing.
func TestNotMigrated(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testNotMigrated[pgx.Tx], testNotMigrated[*sql.Tx])
}

func testNotMigrated[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()
	_, latest, err := migrations.Version(t.Context(), pgoncetest.DB(t), "pgonce_version_probe")
	require.NoError(t, err)

	requireNotMigrated := func(t *testing.T, err error, schema string, applied int64) {
		t.Helper()
		require.ErrorIs(t, err, outbox.ErrNotMigrated)
		msg := err.Error()
		require.Contains(t, msg, fmt.Sprintf("%q", schema))
		require.Contains(t, msg, fmt.Sprintf("needs version %d", latest))
		if applied == 0 {
			require.Contains(t, msg, "not migrated (version 0)")
		} else {
			require.Contains(t, msg, fmt.Sprintf("at version %d", applied))
		}
		require.Contains(t, msg, "pgonce migrate up --schema "+schema)
		require.Contains(t, msg, "migrations.Up")
		require.NotContains(t, msg, "SQLSTATE", "the driver's error is interpreted")
	}
	call := outbox.Call{RunID: "run", Step: 1, Tool: "refund", Args: map[string]any{"amount": "1.00"}}
	newClient := func(t *testing.T, schema string) *outbox.Client[TTx] {
		t.Helper()
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) { return json.RawMessage(`{}`), nil }), outbox.IdempotentByKey))
		return driver.Client(t, outbox.Config{Schema: schema, Registry: registry})
	}
	requireEveryOperation := func(t *testing.T, client *outbox.Client[TTx], schema string, applied int64) {
		t.Helper()
		ctx := t.Context()
		requireNotMigrated(t, client.CheckSchema(ctx), schema, applied)
		_, err := client.Submit(ctx, call)
		requireNotMigrated(t, err, schema, applied)
		key, err := outbox.DeriveKey(call)
		require.NoError(t, err)
		_, err = client.Get(ctx, key)
		requireNotMigrated(t, err, schema, applied)
		waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		_, err = client.Wait(waitCtx, key)
		requireNotMigrated(t, err, schema, applied)
		require.NoError(t, waitCtx.Err(), "Wait returns at once: retrying cannot cure it")
		reconciler, err := reconcile.New(client, reconcile.Config{})
		require.NoError(t, err)
		_, err = reconciler.RunOnce(ctx)
		requireNotMigrated(t, err, schema, applied)
		_, err = client.Do(ctx, call, nil)
		requireNotMigrated(t, err, schema, applied)
		_, err = client.Prune(ctx, nil)
		requireNotMigrated(t, err, schema, applied)
		_, err = client.Stats(ctx)
		requireNotMigrated(t, err, schema, applied)
		err = driver.InTx(t, ctx, func(tx TTx) error {
			_, err := client.SubmitTx(ctx, tx, call)
			return err
		})
		requireNotMigrated(t, err, schema, applied)
	}

	t.Run("NoSchema", func(t *testing.T) {
		t.Parallel()
		schema := pgoncetest.NewSchemaName(t)
		client := newClient(t, schema)
		requireEveryOperation(t, client, schema, 0)
		require.False(t, schemaExists(t, schema), "nothing is created")
	})

	t.Run("SchemaWithoutTables", func(t *testing.T) {
		t.Parallel()
		schema := pgoncetest.NewSchemaName(t)
		_, err := pgoncetest.Pool(t).Exec(t.Context(), "CREATE SCHEMA "+ident.Quote(schema))
		require.NoError(t, err)
		t.Cleanup(func() { pgoncetest.DropSchema(t, schema) })
		client := newClient(t, schema)
		requireEveryOperation(t, client, schema, 0)
	})

	t.Run("OlderVersion", func(t *testing.T) {
		t.Parallel()
		schema := pgoncetest.NewSchemaName(t)
		t.Cleanup(func() { pgoncetest.DropSchema(t, schema) })
		provider, err := migrations.NewProvider(pgoncetest.DB(t), schema)
		require.NoError(t, err)
		_, err = provider.UpTo(t.Context(), 1)
		require.NoError(t, err)
		client := newClient(t, schema)
		requireNotMigrated(t, client.CheckSchema(t.Context()), schema, 1)

		// Version 1 has the key table: a submit works, and an operation on
		// a later version's table says what is missing.
		res, err := client.Submit(t.Context(), call)
		require.NoError(t, err)
		_, err = client.Resolve(t.Context(), res.Key, outbox.Resolution{
			Action: outbox.ResolveRetry, By: "operator", Reason: "test",
		})
		requireNotMigrated(t, err, schema, 1)
	})

	t.Run("MigratedSchemaPasses", func(t *testing.T) {
		t.Parallel()
		client := newClient(t, pgoncetest.Schema(t))
		require.NoError(t, client.CheckSchema(t.Context()))
	})
}

func schemaExists(t *testing.T, schema string) bool {
	t.Helper()
	var exists bool
	err := pgoncetest.Pool(t).QueryRow(t.Context(),
		"SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", schema).Scan(&exists)
	require.NoError(t, err)
	return exists
}
