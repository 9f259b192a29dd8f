package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pressly/goose/v3/database"
)

// ErrNotMigrated is returned when one of pgonce's statements names a table,
// a column or a type that its schema lacks: the schema was never migrated,
// or was migrated by an older build. The error is a [*NotMigratedError].
var ErrNotMigrated = errors.New("schema not migrated")

// NotMigratedError details an [ErrNotMigrated]: the schema, the migration
// version applied to it (0 for none, -1 when it could not be read) and the
// version this build needs.
type NotMigratedError struct {
	Schema  string
	Applied int64
	Needed  int64
	// Detail is PostgreSQL's message about what is missing, or empty for a
	// start-up check that found an old version.
	Detail string
}

// Error names the schema, both versions and the fix.
func (e *NotMigratedError) Error() string {
	applied := fmt.Sprintf("at version %d", e.Applied)
	switch {
	case e.Applied == 0:
		applied = "not migrated (version 0)"
	case e.Applied < 0:
		applied = "at an unknown version"
	}
	msg := fmt.Sprintf("schema %q is %s, this build needs version %d: run `pgonce migrate up --schema %s` or migrations.Up(ctx, db, %q)",
		e.Schema, applied, e.Needed, e.Schema, e.Schema)
	if e.Detail != "" {
		msg += " (" + e.Detail + ")"
	}
	return msg
}

// Is matches [ErrNotMigrated].
func (e *NotMigratedError) Is(target error) bool { return target == ErrNotMigrated }

// Unwrap returns [ErrNotMigrated], never the driver's error.
func (e *NotMigratedError) Unwrap() error { return ErrNotMigrated }

// versionReadTimeout bounds the version read that details an
// [ErrNotMigrated]: it needs a connection of its own, which a pool whose
// every connection is held (by the caller's transaction, say) never frees.
const versionReadTimeout = 2 * time.Second

// CheckSchema reads, without writing anything, the migration version
// applied to the store's schema, and returns a [*NotMigratedError] when it
// is older than this build's.
func (s *Store) CheckSchema(ctx context.Context) error {
	applied, needed, err := s.versionFunc(ctx)
	if err != nil {
		return InterpretErrorContext(ctx, fmt.Errorf("read schema version: %w", err))
	}
	if applied < needed {
		return &NotMigratedError{Schema: s.Schema, Applied: applied, Needed: needed}
	}
	return nil
}

// isUndefinedObject reports whether err is PostgreSQL saying a statement
// named a table (42P01), a column (42703) or a type (42704) that does not
// exist. pgonce's statements name only its own, so the schema is behind.
func isUndefinedObject(err error) (*pgconn.PgError, bool) {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return nil, false
	}
	switch pgErr.Code {
	case "42P01", "42703", "42704", "3F000": // 3F000: invalid_schema_name
		return pgErr, true
	}
	return nil, false
}

// interpretError is [InterpretErrorContext] for the store's own
// statements, which also turns a missing table, column or type into a
// [*NotMigratedError] with the versions read from the schema.
func (s *Store) interpretError(ctx context.Context, err error) error {
	pgErr, ok := isUndefinedObject(err)
	if !ok {
		return InterpretErrorContext(ctx, err)
	}
	readCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), versionReadTimeout)
	defer cancel()
	applied, needed, verr := s.versionFunc(readCtx)
	if verr != nil {
		applied = -1
	}
	return &NotMigratedError{Schema: s.Schema, Applied: applied, Needed: needed, Detail: pgErr.Message}
}

// SchemaVersion is the newest migration this build's statements need: the
// highest version among the migrations package's files, which
// TestSchemaVersionIsTheNewestMigration keeps equal to it. It is a constant
// here so that the store, beneath every public package, imports none.
const SchemaVersion = 8

// versionTable is the goose version table the migrations package keeps in
// the schema.
const versionTable = "pgonce_db_version"

// versionOf reads, without writing anything, the migration version applied
// to the schema (0 when the schema or its version table does not exist) and
// returns it with [SchemaVersion].
func versionOf(schema string, db *sql.DB) func(ctx context.Context) (int64, int64, error) {
	return func(ctx context.Context) (int64, int64, error) {
		applied, err := readVersion(ctx, db, schema)
		return applied, SchemaVersion, err
	}
}

// readVersion reads the applied version through goose's own PostgreSQL
// version store (its TableExists and GetLatestVersion), as
// migrations.Version does; goose.Provider.GetDBVersion is not used because
// it creates the version table when it is missing. The table name is not
// quoted: goose's TableExists splits it at the dot and compares the parts
// with the catalog, and a validated schema name reads the same quoted or not.
func readVersion(ctx context.Context, db *sql.DB, schema string) (int64, error) {
	versions, err := database.NewStore(database.DialectPostgres, schema+"."+versionTable)
	if err != nil {
		return 0, fmt.Errorf("migration version store: %w", err)
	}
	extender, ok := versions.(database.StoreExtender)
	if !ok {
		return 0, errors.New("migration version store: goose's PostgreSQL store cannot tell whether its table exists")
	}
	exists, err := extender.TableExists(ctx, db)
	if err != nil {
		return 0, fmt.Errorf("read migration version: %w", err)
	}
	if !exists {
		return 0, nil
	}
	applied, err := extender.GetLatestVersion(ctx, db)
	if errors.Is(err, database.ErrVersionNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read migration version: %w", err)
	}
	return applied, nil
}
