package main

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/migrations"
)

// catalog describes what schema holds, apart from goose version tables, as
// sorted lines with the schema's name replaced by SCHEMA: tables and their
// storage options, columns, constraints, indexes and sequences.
func catalog(ctx context.Context, t *testing.T, db *sql.DB, schema string) []string {
	t.Helper()
	const query = `
SELECT format('relation %s %s %s', c.relname, c.relkind, coalesce(array_to_string(c.reloptions, ','), ''))
FROM pg_class c
WHERE c.relnamespace = $1::text::regnamespace AND c.relname NOT LIKE '%db\_version%'
UNION ALL
SELECT format('column %s.%s %s not null %s default %s', c.relname, a.attname,
	format_type(a.atttypid, a.atttypmod), a.attnotnull, coalesce(pg_get_expr(d.adbin, d.adrelid), '-'))
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE c.relnamespace = $1::text::regnamespace AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
	AND c.relname NOT LIKE '%db\_version%'
UNION ALL
SELECT format('constraint %s %s %s', c.conrelid::regclass, c.conname, pg_get_constraintdef(c.oid))
FROM pg_constraint c
WHERE c.connamespace = $1::text::regnamespace AND c.conrelid::regclass::text NOT LIKE '%db\_version%'
UNION ALL
SELECT format('index %s', indexdef)
FROM pg_indexes
WHERE schemaname = $1::text AND tablename NOT LIKE '%db\_version%'
ORDER BY 1`
	rows, err := db.QueryContext(ctx, query, schema)
	require.NoError(t, err)
	defer func() { _ = rows.Close() }()
	var lines []string
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		line = strings.ReplaceAll(line, ident.Quote(schema)+".", "SCHEMA.")
		line = strings.ReplaceAll(line, schema+".", "SCHEMA.")
		lines = append(lines, line)
	}
	require.NoError(t, rows.Err())
	require.NotEmpty(t, lines, "schema %s holds nothing", schema)
	return lines
}

// migrationNames returns the embedded migration file names, oldest first.
func migrationNames(t *testing.T) []string {
	t.Helper()
	names, err := fs.Glob(migrations.FS, "*.sql")
	require.NoError(t, err)
	require.NotEmpty(t, names)
	return names
}

func TestMigrateSQL(t *testing.T) {
	t.Parallel()

	type testBundle struct {
		db        *sql.DB
		schema    string // not created
		reference []string
	}
	setup := func(t *testing.T) *testBundle {
		t.Helper()
		db := pgoncetest.DB(t)
		schema := pgoncetest.NewSchemaName(t)
		t.Cleanup(func() { pgoncetest.DropSchema(t, schema) })
		// What migrations.Up makes, to compare with.
		return &testBundle{db: db, schema: schema, reference: catalog(t.Context(), t, db, pgoncetest.Schema(t))}
	}

	// applyWithGoose applies the files in dir to bundle's schema with a
	// plain goose provider, as a user's own tooling would.
	applyWithGoose := func(t *testing.T, bundle *testBundle, dir, versionTable string) {
		t.Helper()
		ctx := t.Context()
		_, err := bundle.db.ExecContext(ctx, "CREATE SCHEMA "+ident.Quote(bundle.schema))
		require.NoError(t, err)
		provider, err := goose.NewProvider(goose.DialectPostgres, bundle.db, os.DirFS(dir),
			goose.WithDisableGlobalRegistry(true),
			goose.WithTableName(bundle.schema+"."+versionTable))
		require.NoError(t, err)
		_, err = provider.Up(ctx)
		require.NoError(t, err)
	}

	t.Run("AllIntoADirectoryMakesWhatUpMakes", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		bundle := setup(t)
		dir := t.TempDir()

		res := pgonce(t, "--schema", bundle.schema, "migrate", "sql", "--all", "--out", dir)
		require.Equal(t, exitOK, res.code, res.stderr)
		for _, name := range migrationNames(t) {
			require.Contains(t, res.stdout, "wrote "+filepath.Join(dir, name))
		}
		applyWithGoose(t, bundle, dir, migrations.TableName)

		current, latest, err := migrations.Version(ctx, bundle.db, bundle.schema)
		require.NoError(t, err)
		require.Equal(t, latest, current)
		require.Equal(t, bundle.reference, catalog(ctx, t, bundle.db, bundle.schema))
	})

	t.Run("OneVersionAtATimeIntoTheUsersOwnSequence", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		bundle := setup(t)
		dir := t.TempDir()

		// A user's goose directory with migrations of its own: pgonce's
		// files are renumbered into its sequence, under its version table.
		require.NoError(t, os.WriteFile(filepath.Join(dir, "00040_users.sql"), []byte(
			"-- +goose Up\nCREATE TABLE "+ident.Quote(bundle.schema)+".users (id bigint PRIMARY KEY);\n"+
				"-- +goose Down\nDROP TABLE "+ident.Quote(bundle.schema)+".users;\n"), 0o600))
		for i, name := range migrationNames(t) {
			version, err := goose.NumericComponent(name)
			require.NoError(t, err)
			res := pgonce(t, "migrate", "sql", "--schema", bundle.schema, "--version", fmt.Sprint(version))
			require.Equal(t, exitOK, res.code, res.stderr)
			require.True(t, strings.HasPrefix(res.stdout, "-- +goose Up"), "a single file is printed as it is:\n%s", res.stdout)
			require.NotContains(t, res.stdout, "TEMPLATE")
			require.Contains(t, res.stdout, ident.Quote(bundle.schema)+".pgonce_")
			own := filepath.Join(dir, fmt.Sprintf("%05d_pgonce_%s", 41+i, name[len("00001_"):]))
			require.NoError(t, os.WriteFile(own, []byte(res.stdout), 0o600))
		}
		applyWithGoose(t, bundle, dir, "goose_db_version")

		got := catalog(ctx, t, bundle.db, bundle.schema)
		var withoutUsers []string
		for _, line := range got {
			if !strings.Contains(line, "users") {
				withoutUsers = append(withoutUsers, line)
			}
		}
		require.Equal(t, bundle.reference, withoutUsers)
		// pgonce's own version table was never made: Version says so.
		current, _, err := migrations.Version(ctx, bundle.db, bundle.schema)
		require.NoError(t, err)
		require.Zero(t, current)
	})

	t.Run("NeedsNoDatabase", func(t *testing.T) {
		t.Parallel()
		res := pgonceEnv(t, []string{"PGONCE_DATABASE_URL=postgres://127.0.0.1:1/nothing?connect_timeout=1"},
			"migrate", "sql", "--all")
		require.Equal(t, exitOK, res.code, res.stderr)
		for _, name := range migrationNames(t) {
			require.Contains(t, res.stdout, "-- pgonce migration "+name+"\n-- +goose Up")
		}
		require.Contains(t, res.stdout, `"pgonce".pgonce_key`, "the default schema")
	})

	t.Run("DownPrintsDownSectionsNewestFirst", func(t *testing.T) {
		t.Parallel()
		res := pgonce(t, "--schema", "tenant_a", "migrate", "sql", "--all", "--down")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.NotContains(t, res.stdout, "+goose Up")
		// No Up section's statements: a Down restores a function at most
		// (00004 puts back 00001's invariants).
		require.NotContains(t, res.stdout, "CREATE TABLE")
		require.NotContains(t, res.stdout, "CREATE INDEX")
		names := migrationNames(t)
		newest, oldest := strings.Index(res.stdout, names[len(names)-1]), strings.Index(res.stdout, names[0])
		require.GreaterOrEqual(t, newest, 0)
		require.Less(t, newest, oldest)
		require.Contains(t, res.stdout, `DROP TABLE "tenant_a".pgonce_key;`)
	})

	t.Run("UsageErrors", func(t *testing.T) {
		t.Parallel()
		existing := t.TempDir()
		name := migrationNames(t)[0]
		require.NoError(t, os.WriteFile(filepath.Join(existing, name), []byte("mine"), 0o600))
		for _, tt := range []struct {
			name string
			args []string
			want string
		}{
			{"NoSelection", []string{"migrate", "sql"}, "pass --version N or --all"},
			{"BothSelections", []string{"migrate", "sql", "--all", "--version", "1"}, "not both"},
			{"UnknownVersion", []string{"migrate", "sql", "--version", "999"}, "no migration has version 999"},
			{"DownIntoADirectory", []string{"migrate", "sql", "--all", "--down", "--out", t.TempDir()}, "does not combine with --out"},
			{"InvalidSchema", []string{"--schema", `x"; DROP`, "migrate", "sql", "--all"}, "--schema: invalid schema name"},
			{"ExistingFile", []string{"migrate", "sql", "--all", "--out", existing}, "file exists"},
		} {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				res := pgonce(t, tt.args...)
				require.Equal(t, exitUsage, res.code, res.stdout)
				require.Contains(t, res.stderr, tt.want)
			})
		}
		body, err := os.ReadFile(filepath.Join(existing, name))
		require.NoError(t, err)
		require.Equal(t, "mine", string(body), "a file in the way is never replaced")
	})
}
