package main

import (
	"os/user"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/migrations"
)

func TestVersionCommand(t *testing.T) {
	t.Parallel()
	_, latest, err := migrations.Version(t.Context(), pgoncetest.DB(t), pgoncetest.NewSchemaName(t))
	require.NoError(t, err)
	res := pgonceEnv(t, []string{"PGONCE_DATABASE_URL=postgres://nobody@127.0.0.1:1/none"}, "version")
	require.Equal(t, exitOK, res.code, "needs no database: %s", res.stderr)
	require.True(t, strings.HasPrefix(res.stdout, "pgonce "), res.stdout)
	require.Contains(t, res.stdout, "schema version "+strconv.FormatInt(latest, 10))
	res = pgonce(t, "version", "--json")
	require.Equal(t, exitOK, res.code, res.stderr)
	require.InDelta(t, latest, decodeJSON(t, res.stdout)["schema_version"], 0)
}

func TestMigrateStatusChangesNothing(t *testing.T) {
	t.Parallel()
	schema := pgoncetest.NewSchemaName(t)
	t.Cleanup(func() { pgoncetest.DropSchema(t, schema) })
	res := pgonce(t, "--schema", schema, "migrate", "status", "--json")
	require.Equal(t, exitOK, res.code, res.stderr)
	migrationsList := decodeJSON(t, res.stdout)["migrations"].([]any)
	require.Len(t, migrationsList, len(migrationNames(t)))
	for _, m := range migrationsList {
		require.Equal(t, false, m.(map[string]any)["applied"])
	}
	var exists bool
	require.NoError(t, pgoncetest.Pool(t).QueryRow(t.Context(),
		"SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", schema).Scan(&exists))
	require.False(t, exists, "migrate status created the schema")

	// Migrated, it reports what is applied.
	require.Equal(t, exitOK, pgonce(t, "--schema", schema, "migrate", "up").code)
	res = pgonce(t, "--schema", schema, "migrate", "status")
	require.Equal(t, exitOK, res.code, res.stderr)
	require.NotContains(t, res.stdout, "pending")
}

func TestConnectionHints(t *testing.T) {
	t.Parallel()
	base := strings.TrimSuffix(pgoncetest.DatabaseURL(t), "?sslmode=disable")
	base = base[:strings.LastIndex(base, "/")]

	t.Run("MissingDatabase", func(t *testing.T) {
		t.Parallel()
		res := pgonceEnv(t, []string{"PGONCE_DATABASE_URL=" + base + "/pgonce_no_such_db?sslmode=disable"}, "status")
		require.Equal(t, exitFailure, res.code)
		require.Contains(t, res.stderr, "no such database")
		require.Contains(t, res.stderr, "createdb")
		require.NotContains(t, res.stderr, "Start a server")
	})

	t.Run("MissingRole", func(t *testing.T) {
		t.Parallel()
		url := strings.Replace(base, "postgres@", "pgonce_no_such_role@", 1) + "/postgres?sslmode=disable"
		res := pgonceEnv(t, []string{"PGONCE_DATABASE_URL=" + url}, "status")
		require.Equal(t, exitFailure, res.code)
		require.Contains(t, res.stderr, "refused the login")
		require.NotContains(t, res.stderr, "Start a server")
	})

	t.Run("NoServer", func(t *testing.T) {
		t.Parallel()
		res := pgonceEnv(t, []string{"PGONCE_DATABASE_URL=postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=2"}, "status")
		require.Equal(t, exitFailure, res.code)
		require.Contains(t, res.stderr, "Start a server")
	})
}

func TestResolveByWithoutUser(t *testing.T) {
	t.Parallel()
	account, err := user.Current()
	require.NoError(t, err)
	f := newFixture(t)
	key := f.needsReview(t)
	res := pgonceEnv(t, []string{"PGONCE_DATABASE_URL=" + pgoncetest.DatabaseURL(t), "USER=", "LOGNAME=ops-cron"},
		"--schema", f.schema, "resolve", string(key), "--retry", "--reason", "provider says it never arrived")
	require.Equal(t, exitOK, res.code, res.stderr)
	require.Contains(t, res.stdout, "retry by ops-cron")

	key = f.needsReview(t)
	res = pgonceEnv(t, []string{"PGONCE_DATABASE_URL=" + pgoncetest.DatabaseURL(t), "USER=", "LOGNAME="},
		"--schema", f.schema, "resolve", string(key), "--retry", "--reason", "again")
	require.Equal(t, exitOK, res.code, res.stderr)
	require.Contains(t, res.stdout, "retry by "+account.Username)
}

func TestInspectShowsLastErrorInEveryState(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	key := f.needsReview(t)
	res := pgonce(t, "--schema", f.schema, "inspect", string(key))
	require.Equal(t, exitOK, res.code, res.stderr)
	require.Regexp(t, `last error\s+.*timeout`, res.stdout)
	res = pgonce(t, "--schema", f.schema, "inspect", string(key), "--json")
	require.Equal(t, exitOK, res.code, res.stderr)
	require.Contains(t, decodeJSON(t, res.stdout)["last_error"], "timeout")
}

func TestReconcileJSONDurationsInMilliseconds(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	res := pgonce(t, "--schema", f.schema, "reconcile", "--once", "--json")
	require.Equal(t, exitOK, res.code, res.stderr)
	report := decodeJSON(t, res.stdout)
	require.Contains(t, report, "oldest_stale_pending_ms")
	for field := range report {
		require.False(t, strings.HasSuffix(field, "_ns"), "field %s: every duration is in milliseconds", field)
	}
}
