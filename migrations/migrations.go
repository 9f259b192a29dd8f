// Package migrations holds pgonce's schema as goose SQL migrations, embedded
// in the binary, and runs them into a schema of your choice.
//
// Run them from your own code at start-up:
//
//	if err := migrations.Up(ctx, db, "pgonce"); err != nil {
//		return err
//	}
//
// pgx users pass stdlib.OpenDBFromPool(pool). For your own goose tooling,
// [NewProvider] returns a goose provider over the same migrations, and [FS]
// holds the raw files.
//
// # Schemas
//
// Every table lives in one schema (default "pgonce"); several schemas can
// live side by side in one database. The schema name is validated as a plain
// lower-case identifier and always quoted. The goose version table is
// pgonce_db_version inside that schema, so pgonce's history never mixes with
// yours.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"path"
	"strings"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/pgonce/pgonce/internal/ident"
)

// FS holds the goose SQL migration files. The files name their tables without
// a schema; run through [NewProvider], [Up] or [Down] they are created in the
// chosen schema. Applied with other tooling, they land in the first schema of
// the connection's search_path.
//
//go:embed *.sql
var FS embed.FS

// SchemaDefault is the schema pgonce uses when none is configured.
const SchemaDefault = "pgonce"

// TableName is the goose version table kept in the pgonce schema.
const TableName = "pgonce_db_version"

// ErrInvalidSchema is returned for a schema name that is not a plain
// lower-case identifier. Nothing is changed in the database.
var ErrInvalidSchema = ident.ErrInvalidSchema

// NewProvider returns a goose provider that applies pgonce's migrations to
// schema, creating the schema first if it does not exist. It sets the version
// table to pgonce_db_version in that schema and disables goose's global
// registry; opts may add options such as goose.WithSessionLocker or
// goose.WithSlog.
//
// Each migration runs in a transaction whose search_path is the schema alone,
// so the files never touch another schema. Never call Close on the provider
// when db is yours: it closes db.
func NewProvider(db *sql.DB, schema string, opts ...goose.ProviderOption) (*goose.Provider, error) {
	if err := ident.ValidateSchema(schema); err != nil {
		return nil, err
	}
	migrations, err := goMigrations(schema)
	if err != nil {
		return nil, err
	}
	opts = append([]goose.ProviderOption{
		goose.WithTableName(schema + "." + TableName),
		goose.WithDisableGlobalRegistry(true),
		goose.WithGoMigrations(migrations...),
	}, opts...)
	return goose.NewProvider(goose.DialectPostgres, db, nil, opts...)
}

// Up creates schema if needed and applies every pending migration to it. It
// is safe to call at every start-up and from several processes at once: a
// session advisory lock, per schema, lets one migrate while the others wait.
func Up(ctx context.Context, db *sql.DB, schema string) error {
	provider, err := lockedProvider(ctx, db, schema)
	if err != nil {
		return err
	}
	if _, err := provider.Up(ctx); err != nil {
		return fmt.Errorf("migrate up: %w", err)
	}
	return nil
}

// Down rolls every applied migration back, dropping pgonce's tables from
// schema and every key, response and tombstone with them. The schema itself
// and the version table are left in place.
func Down(ctx context.Context, db *sql.DB, schema string) error {
	provider, err := lockedProvider(ctx, db, schema)
	if err != nil {
		return err
	}
	if _, err := provider.DownTo(ctx, 0); err != nil {
		return fmt.Errorf("migrate down: %w", err)
	}
	return nil
}

// Status reports each migration and whether it is applied to schema.
func Status(ctx context.Context, db *sql.DB, schema string) ([]*goose.MigrationStatus, error) {
	provider, err := lockedProvider(ctx, db, schema)
	if err != nil {
		return nil, err
	}
	status, err := provider.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("migration status: %w", err)
	}
	return status, nil
}

// ValidateSchema returns an error matching [ErrInvalidSchema] when name is
// not a schema name pgonce accepts: a plain lower-case identifier (letters
// a-z, digits, underscores, not starting with a digit), at most 48 bytes, and
// not in the pg_ namespace.
func ValidateSchema(name string) error { return ident.ValidateSchema(name) }

// Version reads, without writing anything, the migration version applied to
// schema (0 when the schema or its version table does not exist) and the
// newest version embedded in this build. current < latest means [Up] has
// work to do.
func Version(ctx context.Context, db *sql.DB, schema string) (current, latest int64, err error) {
	if err := ident.ValidateSchema(schema); err != nil {
		return 0, 0, err
	}
	entries, err := fs.Glob(FS, "*.sql")
	if err != nil {
		return 0, 0, err
	}
	for _, name := range entries {
		version, err := goose.NumericComponent(name)
		if err != nil {
			return 0, 0, fmt.Errorf("migration %s: %w", name, err)
		}
		latest = max(latest, version)
	}
	table := ident.Quote(schema) + "." + TableName
	var exists bool
	if err := db.QueryRowContext(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&exists); err != nil {
		return 0, latest, fmt.Errorf("read migration version: %w", err)
	}
	if !exists {
		return 0, latest, nil
	}
	if err := db.QueryRowContext(ctx, "SELECT coalesce(max(version_id), 0) FROM "+table).Scan(&current); err != nil {
		return 0, latest, fmt.Errorf("read migration version: %w", err)
	}
	return current, latest, nil
}

func lockedProvider(ctx context.Context, db *sql.DB, schema string) (*goose.Provider, error) {
	if err := ident.ValidateSchema(schema); err != nil {
		return nil, err
	}
	// One lock per schema: migrating one schema never waits on another.
	hash := fnv.New64a()
	_, _ = hash.Write([]byte("pgonce/migrations/" + schema))
	lockID := int64(hash.Sum64() >> 1) //nolint:gosec // shifted into int64 range
	if err := createSchema(ctx, db, schema, lockID); err != nil {
		return nil, err
	}
	locker, err := lock.NewPostgresSessionLocker(
		lock.WithLockID(lockID),
		lock.WithLockTimeout(1, 300),
	)
	if err != nil {
		return nil, fmt.Errorf("migration lock: %w", err)
	}
	return NewProvider(db, schema, goose.WithSessionLocker(locker))
}

// createSchema creates schema under the migration lock: two concurrent
// CREATE SCHEMA IF NOT EXISTS of one name can both miss it and collide.
func createSchema(ctx context.Context, db *sql.DB, schema string, lockID int64) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", lockID); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	if _, err := tx.ExecContext(ctx, "CREATE SCHEMA IF NOT EXISTS "+ident.Quote(schema)); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	return nil
}

// goMigrations turns the embedded SQL files into goose Go migrations bound to
// schema. goose's SQL runner cannot set a per-migration search_path, so each
// section runs in one statement batch after SET LOCAL search_path.
func goMigrations(schema string) ([]*goose.Migration, error) {
	entries, err := fs.Glob(FS, "*.sql")
	if err != nil {
		return nil, err
	}
	migrations := make([]*goose.Migration, 0, len(entries))
	for _, name := range entries {
		version, err := goose.NumericComponent(name)
		if err != nil {
			return nil, fmt.Errorf("migration %s: %w", name, err)
		}
		body, err := FS.ReadFile(name)
		if err != nil {
			return nil, err
		}
		up, down, err := splitSections(string(body))
		if err != nil {
			return nil, fmt.Errorf("migration %s: %w", path.Base(name), err)
		}
		migrations = append(migrations, goose.NewGoMigration(version,
			&goose.GoFunc{RunTx: runIn(schema, up)},
			&goose.GoFunc{RunTx: runIn(schema, down)},
		))
	}
	return migrations, nil
}

func runIn(schema, statements string) func(context.Context, *sql.Tx) error {
	return func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, "SET LOCAL search_path TO "+ident.Quote(schema)); err != nil {
			return err
		}
		// Without arguments the pgx driver sends the text with the simple
		// protocol, which runs several statements in one round trip.
		_, err := tx.ExecContext(ctx, statements)
		return err
	}
}

// splitSections returns the Up and Down sections of a goose SQL file. The
// files use no NO TRANSACTION or ENVSUB annotations; StatementBegin/End
// markers are comments to the simple protocol and may stay.
func splitSections(body string) (up, down string, err error) {
	const upMark, downMark = "-- +goose Up", "-- +goose Down"
	upAt, downAt := strings.Index(body, upMark), strings.Index(body, downMark)
	if upAt < 0 || downAt < upAt {
		return "", "", errors.New("needs a -- +goose Up section followed by a -- +goose Down section")
	}
	if strings.Contains(body, "+goose NO TRANSACTION") || strings.Contains(body, "+goose ENVSUB") {
		return "", "", errors.New("annotations other than Up, Down and StatementBegin/End are not supported")
	}
	return body[upAt+len(upMark) : downAt], body[downAt+len(downMark):], nil
}
