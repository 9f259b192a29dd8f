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
// [NewProvider] returns a goose provider over the same migrations, [Files]
// returns the files with a schema filled in, and [FS] holds them as written.
//
// # Schemas
//
// Every table lives in one schema (default "pgonce"); several schemas can
// live side by side in one database. The files name each of pgonce's tables
// behind the marker /* TEMPLATE: schema */, which [Files] replaces with the
// quoted schema and a dot, so every statement names its schema and none
// depends on the connection's search_path. The schema name is validated as a
// plain lower-case identifier and always quoted. The goose version table is
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
	"strings"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
	"github.com/pressly/goose/v3/lock"
)

// FS holds the goose SQL migration files as written, each table name behind
// the marker /* TEMPLATE: schema */. The marker is a comment, so applied as
// they are the files create their tables in the first schema of the
// connection's search_path; [Files] fills the schema in.
//
//go:embed *.sql
var FS embed.FS

// SchemaDefault is the schema pgonce uses when none is configured.
const SchemaDefault = "pgonce"

// TableName is the goose version table kept in the pgonce schema.
const TableName = "pgonce_db_version"

// schemaMarker stands for "the schema and a dot" in front of every table
// name in the files: the marker style of river's sqlc templates.
const schemaMarker = "/* TEMPLATE: schema */"

// ErrInvalidSchema is returned for a schema name that is not a plain
// lower-case identifier. Nothing is changed in the database.
var ErrInvalidSchema = errInvalidSchema()

// Files returns pgonce's goose files with schema filled in: every
// /* TEMPLATE: schema */ marker replaced by the quoted schema and a dot. The
// files keep their names (00001_….sql, …) and goose annotations, so they can
// be read by goose or copied into a goose directory.
func Files(schema string) (fs.FS, error) {
	if err := ValidateSchema(schema); err != nil {
		return nil, err
	}
	names, err := fs.Glob(FS, "*.sql")
	if err != nil {
		return nil, err
	}
	prefix := quoteIdent(schema) + "."
	files := make(filledFS, len(names))
	for _, name := range names {
		body, err := FS.ReadFile(name)
		if err != nil {
			return nil, err
		}
		files[name] = []byte(strings.ReplaceAll(string(body), schemaMarker, prefix))
	}
	return files, nil
}

// NewProvider returns a goose provider that applies pgonce's migrations,
// read by goose from [Files], to schema. It keeps the version table
// pgonce_db_version in that schema, creating the schema when goose creates
// the version table, and disables goose's global registry; opts may add
// options such as goose.WithSessionLocker or goose.WithSlog (but not
// goose.WithTableName or goose.WithStore: the table is fixed).
//
// Never call Close on the provider when db is yours: it closes db.
func NewProvider(db *sql.DB, schema string, opts ...goose.ProviderOption) (*goose.Provider, error) {
	files, err := Files(schema)
	if err != nil {
		return nil, err
	}
	store, err := newVersionStore(schema)
	if err != nil {
		return nil, err
	}
	opts = append([]goose.ProviderOption{
		goose.WithStore(&schemaCreatingStore{StoreExtender: store, schema: schema}),
		goose.WithDisableGlobalRegistry(true),
	}, opts...)
	// DialectCustom only because the store is passed in: it is goose's own
	// PostgreSQL store, wrapped to create the schema first.
	return goose.NewProvider(goose.DialectCustom, db, files, opts...)
}

// Up creates schema if needed and applies every pending migration to it. It
// is safe to call at every start-up and from several processes at once: a
// session advisory lock, per schema, lets one migrate while the others wait.
func Up(ctx context.Context, db *sql.DB, schema string) error {
	provider, err := lockedProvider(db, schema)
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
	provider, err := lockedProvider(db, schema)
	if err != nil {
		return err
	}
	if _, err := provider.DownTo(ctx, 0); err != nil {
		return fmt.Errorf("migrate down: %w", err)
	}
	return nil
}

// Status reports each migration and whether it is applied to schema. Like
// goose's own status, it creates the schema and the version table when they
// are missing.
func Status(ctx context.Context, db *sql.DB, schema string) ([]*goose.MigrationStatus, error) {
	provider, err := lockedProvider(db, schema)
	if err != nil {
		return nil, err
	}
	status, err := provider.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("migration status: %w", err)
	}
	return status, nil
}

// Version reads, without writing anything, the migration version applied to
// schema (0 when the schema or its version table does not exist) and the
// newest version embedded in this build. current < latest means [Up] has
// work to do.
//
// The applied version is read through goose's own version store
// (database.Store for PostgreSQL, its TableExists and GetLatestVersion) over
// the schema's pgonce_db_version; goose.Provider.GetDBVersion is not used
// because it creates the version table when it is missing. The latest
// version is the newest source goose finds in [Files].
func Version(ctx context.Context, db *sql.DB, schema string) (current, latest int64, err error) {
	provider, err := NewProvider(db, schema)
	if err != nil {
		return 0, 0, err
	}
	for _, source := range provider.ListSources() {
		latest = max(latest, source.Version)
	}
	store, err := newVersionStore(schema)
	if err != nil {
		return 0, latest, err
	}
	exists, err := store.TableExists(ctx, db)
	if err != nil {
		return 0, latest, fmt.Errorf("read migration version: %w", err)
	}
	if !exists {
		return 0, latest, nil
	}
	current, err = store.GetLatestVersion(ctx, db)
	if errors.Is(err, database.ErrVersionNotFound) {
		return 0, latest, nil
	}
	if err != nil {
		return 0, latest, fmt.Errorf("read migration version: %w", err)
	}
	return current, latest, nil
}

// newVersionStore returns goose's PostgreSQL version store for schema's
// pgonce_db_version. The name is not quoted: goose's TableExists splits it
// at the dot and compares the parts with the catalog, and a validated
// schema name reads the same quoted or not.
func newVersionStore(schema string) (database.StoreExtender, error) {
	store, err := database.NewStore(database.DialectPostgres, schema+"."+TableName)
	if err != nil {
		return nil, fmt.Errorf("migration version store: %w", err)
	}
	extender, ok := store.(database.StoreExtender)
	if !ok {
		return nil, errors.New("migration version store: goose's PostgreSQL store cannot tell whether its table exists")
	}
	return extender, nil
}

// schemaCreatingStore is goose's version store with one addition: the
// schema is created, if missing, just before the version table, in the same
// transaction and under a per-schema transaction lock, because two
// concurrent CREATE SCHEMA IF NOT EXISTS of one name can both miss it and
// collide.
type schemaCreatingStore struct {
	database.StoreExtender
	schema string
}

// CreateVersionTable creates the schema, then the version table in it.
func (s *schemaCreatingStore) CreateVersionTable(ctx context.Context, db database.DBTxConn) error {
	if _, err := db.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", lockID(s.schema)); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	if _, err := db.ExecContext(ctx, "CREATE SCHEMA IF NOT EXISTS "+quoteIdent(s.schema)); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	return s.StoreExtender.CreateVersionTable(ctx, db)
}

// lockID is the advisory lock that serialises migrations of one schema:
// migrating one schema never waits on another.
func lockID(schema string) int64 {
	hash := fnv.New64a()
	_, _ = hash.Write([]byte("pgonce/migrations/" + schema))
	return int64(hash.Sum64() >> 1) //nolint:gosec // shifted into int64 range
}

// lockedProvider is [NewProvider] under goose's session locker on the
// schema's lock, so that concurrent calls for one schema run one at a time.
func lockedProvider(db *sql.DB, schema string) (*goose.Provider, error) {
	if err := ValidateSchema(schema); err != nil {
		return nil, err
	}
	locker, err := lock.NewPostgresSessionLocker(
		lock.WithLockID(lockID(schema)),
		lock.WithLockTimeout(1, 300),
	)
	if err != nil {
		return nil, fmt.Errorf("migration lock: %w", err)
	}
	return NewProvider(db, schema, goose.WithSessionLocker(locker))
}
