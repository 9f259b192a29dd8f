package migrations_test

import (
	"context"
	"database/sql"
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/migrations"
)

func tablesIn(ctx context.Context, t *testing.T, db *sql.DB, schema string) []string {
	t.Helper()
	rows, err := db.QueryContext(ctx,
		`SELECT tablename FROM pg_tables WHERE schemaname = $1 ORDER BY tablename`, schema)
	require.NoError(t, err)
	defer func() { _ = rows.Close() }()
	var tables []string
	for rows.Next() {
		var name string
		require.NoError(t, rows.Scan(&name))
		tables = append(tables, name)
	}
	require.NoError(t, rows.Err())
	return tables
}

func schemaExists(ctx context.Context, t *testing.T, db *sql.DB, schema string) bool {
	t.Helper()
	var exists bool
	require.NoError(t, db.QueryRowContext(ctx,
		`SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&exists))
	return exists
}

func TestUp(t *testing.T) {
	t.Parallel()

	allTables := []string{"pgonce_attempt", "pgonce_db_version", "pgonce_key", "pgonce_leader", "pgonce_resolution", "pgonce_tool", "pgonce_tool_action"}

	t.Run("AppliesToEmptyDatabaseAndIsIdempotent", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		db := pgoncetest.DB(t)
		schema := pgoncetest.NewSchemaName(t)
		t.Cleanup(func() { pgoncetest.DropSchema(t, schema) })

		require.NoError(t, migrations.Up(ctx, db, schema))
		require.Equal(t, allTables, tablesIn(ctx, t, db, schema))
		require.NoError(t, migrations.Up(ctx, db, schema))

		status, err := migrations.Status(ctx, db, schema)
		require.NoError(t, err)
		require.NotEmpty(t, status)
		for _, s := range status {
			require.Equal(t, goose.StateApplied, s.State, "migration %d", s.Source.Version)
		}
	})

	t.Run("GoesDownCleanly", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		db := pgoncetest.DB(t)
		schema := pgoncetest.NewSchemaName(t)
		t.Cleanup(func() { pgoncetest.DropSchema(t, schema) })

		require.NoError(t, migrations.Up(ctx, db, schema))
		require.NoError(t, migrations.Down(ctx, db, schema))
		require.Equal(t, []string{"pgonce_db_version"}, tablesIn(ctx, t, db, schema))

		status, err := migrations.Status(ctx, db, schema)
		require.NoError(t, err)
		for _, s := range status {
			require.Equal(t, goose.StatePending, s.State)
		}
		// And up again after down.
		require.NoError(t, migrations.Up(ctx, db, schema))
		require.Equal(t, allTables, tablesIn(ctx, t, db, schema))
	})

	t.Run("SchemasLiveSideBySide", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		db := pgoncetest.DB(t)
		// first goes down below, which the invariant check of
		// pgoncetest.Schema's cleanup would not survive.
		first, second := pgoncetest.NewSchemaName(t), pgoncetest.Schema(t)
		t.Cleanup(func() { pgoncetest.DropSchema(t, first) })
		require.NoError(t, migrations.Up(ctx, db, first))

		_, err := db.ExecContext(ctx, `INSERT INTO "`+first+`".pgonce_key
			(key, scope, run_id, step, tool, args)
			VALUES (sha256('k'), sha256('s'), 'run', 1, 'refund', '{}')`)
		require.NoError(t, err)

		var count int
		require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM "`+first+`".pgonce_key`).Scan(&count))
		require.Equal(t, 1, count)
		require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM "`+second+`".pgonce_key`).Scan(&count))
		require.Equal(t, 0, count)

		// Going down in one leaves the other whole.
		require.NoError(t, migrations.Down(ctx, db, first))
		require.Equal(t, []string{"pgonce_db_version"}, tablesIn(ctx, t, db, first))
		require.Equal(t, allTables, tablesIn(ctx, t, db, second))
		current, latest, err := migrations.Version(ctx, db, second)
		require.NoError(t, err)
		require.Equal(t, latest, current)
	})

	t.Run("NeedsNoSearchPath", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		db := pgoncetest.DB(t)
		schema := pgoncetest.NewSchemaName(t)
		t.Cleanup(func() { pgoncetest.DropSchema(t, schema) })

		// The test connections have an empty search_path, so a table name
		// the files forgot to mark fails to create.
		var searchPath string
		require.NoError(t, db.QueryRowContext(ctx, `SHOW search_path`).Scan(&searchPath))
		require.Empty(t, searchPath)
		require.NoError(t, migrations.Up(ctx, db, schema))
		require.Equal(t, allTables, tablesIn(ctx, t, db, schema))
	})

	t.Run("NewProviderCreatesTheSchema", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		db := pgoncetest.DB(t)
		schema := pgoncetest.NewSchemaName(t)
		t.Cleanup(func() { pgoncetest.DropSchema(t, schema) })

		provider, err := migrations.NewProvider(db, schema)
		require.NoError(t, err)
		results, err := provider.Up(ctx)
		require.NoError(t, err)
		require.Len(t, results, len(provider.ListSources()))
		require.Equal(t, allTables, tablesIn(ctx, t, db, schema))
		current, latest, err := migrations.Version(ctx, db, schema)
		require.NoError(t, err)
		require.Equal(t, latest, current)
	})

	t.Run("ConcurrentUpsOfOneSchema", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		db := pgoncetest.DB(t)
		schema := pgoncetest.NewSchemaName(t)
		t.Cleanup(func() { pgoncetest.DropSchema(t, schema) })

		errs := make(chan error, 4)
		for range 4 {
			go func() { errs <- migrations.Up(ctx, db, schema) }()
		}
		for range 4 {
			require.NoError(t, <-errs)
		}
		require.Equal(t, allTables, tablesIn(ctx, t, db, schema))
	})
}

func TestInvalidSchemaChangesNothing(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		name   string
		schema string
	}{
		{"Injection", `x"; DROP TABLE users; --`},
		{"Empty", ""},
		{"UpperCase", "Pgonce"},
		{"LeadingDigit", "1pgonce"},
		{"Space", "pg once"},
		{"ReservedPrefix", "pg_pgonce"},
		{"TooLong", "a234567890123456789012345678901234567890123456789"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			db := pgoncetest.DB(t)

			err := migrations.Up(ctx, db, tt.schema)
			require.ErrorIs(t, err, migrations.ErrInvalidSchema)
			require.ErrorIs(t, migrations.Down(ctx, db, tt.schema), migrations.ErrInvalidSchema)
			_, err = migrations.Status(ctx, db, tt.schema)
			require.ErrorIs(t, err, migrations.ErrInvalidSchema)
			_, err = migrations.NewProvider(db, tt.schema)
			require.ErrorIs(t, err, migrations.ErrInvalidSchema)

			require.False(t, schemaExists(ctx, t, db, tt.schema))
		})
	}
}

func TestFS(t *testing.T) {
	t.Parallel()

	// The embedded files are ordinary goose files: goose's own parser reads
	// them, so users can run them from their own goose tooling.
	entries, err := migrations.FS.ReadDir(".")
	require.NoError(t, err)
	files := fstest.MapFS{}
	for _, entry := range entries {
		body, err := migrations.FS.ReadFile(entry.Name())
		require.NoError(t, err)
		files[entry.Name()] = &fstest.MapFile{Data: body}
	}
	require.NotEmpty(t, files)
	provider, err := goose.NewProvider(goose.DialectPostgres, pgoncetest.DB(t), files,
		goose.WithDisableGlobalRegistry(true))
	require.NoError(t, err)
	require.Len(t, provider.ListSources(), len(entries))
}

func TestVersion(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgoncetest.DB(t)
	schema := pgoncetest.NewSchemaName(t)
	t.Cleanup(func() { pgoncetest.DropSchema(t, schema) })

	current, latest, err := migrations.Version(ctx, db, schema)
	require.NoError(t, err)
	require.Zero(t, current)
	require.Positive(t, latest)
	require.False(t, schemaExists(ctx, t, db, schema), "Version writes nothing")

	require.NoError(t, migrations.Up(ctx, db, schema))
	current, latest2, err := migrations.Version(ctx, db, schema)
	require.NoError(t, err)
	require.Equal(t, latest, latest2)
	require.Equal(t, latest, current)

	t.Run("CreatesNothingInASchemaWithoutVersionTable", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		db := pgoncetest.DB(t)
		schema := pgoncetest.NewSchemaName(t)
		t.Cleanup(func() { pgoncetest.DropSchema(t, schema) })
		_, err := db.ExecContext(ctx, `CREATE SCHEMA "`+schema+`"`)
		require.NoError(t, err)

		current, latest, err := migrations.Version(ctx, db, schema)
		require.NoError(t, err)
		require.Zero(t, current)
		require.Positive(t, latest)
		require.Empty(t, tablesIn(ctx, t, db, schema), "Version writes nothing")
	})

	t.Run("ZeroAfterDown", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		db := pgoncetest.DB(t)
		schema := pgoncetest.NewSchemaName(t)
		t.Cleanup(func() { pgoncetest.DropSchema(t, schema) })

		require.NoError(t, migrations.Up(ctx, db, schema))
		require.NoError(t, migrations.Down(ctx, db, schema))
		current, _, err := migrations.Version(ctx, db, schema)
		require.NoError(t, err)
		require.Zero(t, current)
	})

	_, _, err = migrations.Version(ctx, db, `x"; DROP TABLE users; --`)
	require.ErrorIs(t, err, migrations.ErrInvalidSchema)
	require.ErrorIs(t, migrations.ValidateSchema("Bad"), migrations.ErrInvalidSchema)
	require.NoError(t, migrations.ValidateSchema("pgonce"))
}

func TestFiles(t *testing.T) {
	t.Parallel()

	t.Run("FillsInTheQuotedSchema", func(t *testing.T) {
		t.Parallel()
		files, err := migrations.Files("tenant_a")
		require.NoError(t, err)
		names, err := fs.Glob(files, "*.sql")
		require.NoError(t, err)
		embedded, err := fs.Glob(migrations.FS, "*.sql")
		require.NoError(t, err)
		require.Equal(t, embedded, names)
		for _, name := range names {
			body, err := fs.ReadFile(files, name)
			require.NoError(t, err)
			raw, err := migrations.FS.ReadFile(name)
			require.NoError(t, err)
			require.NotContains(t, string(body), "TEMPLATE", name)
			require.Equal(t, strings.Count(string(raw), schemaMarker), strings.Count(string(body), `"tenant_a".pgonce_`), name)
			require.Contains(t, string(body), "-- +goose Up", name)
			require.Contains(t, string(body), "-- +goose Down", name)
		}
		require.NoError(t, fstest.TestFS(files, embedded...))
	})

	t.Run("GooseReadsThem", func(t *testing.T) {
		t.Parallel()
		files, err := migrations.Files("tenant_a")
		require.NoError(t, err)
		provider, err := goose.NewProvider(goose.DialectPostgres, pgoncetest.DB(t), files,
			goose.WithDisableGlobalRegistry(true))
		require.NoError(t, err)
		embedded, err := fs.Glob(migrations.FS, "*.sql")
		require.NoError(t, err)
		require.Len(t, provider.ListSources(), len(embedded))
	})

	t.Run("RefusesAnInvalidSchema", func(t *testing.T) {
		t.Parallel()
		_, err := migrations.Files(`x"; DROP TABLE users; --`)
		require.ErrorIs(t, err, migrations.ErrInvalidSchema)
	})
}
