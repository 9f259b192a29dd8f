package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/pgonce/pgonce/migrations"
	"github.com/pgonce/pgonce/outbox"
)

const (
	databaseURLDefault = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	schemaDefault      = migrations.SchemaDefault
	// connectTimeout bounds the first connection, so that an unreachable
	// server is reported instead of waited for.
	connectTimeout = 10 * time.Second
)

// env is what every command shares: the connection settings and the output.
type env struct {
	stdout, stderr io.Writer
	databaseURL    string
	schema         string
	// pooling is --pooling: "session" or "transaction", or empty for
	// $PGONCE_POOLING, else session.
	pooling string
}

// globalFlags defines the connection flags on fs. Defined on the global
// flag set and again on each command's, they write the same fields, so they
// may be given before or after the command name.
func (e *env) globalFlags(fs *flag.FlagSet) { e.commandGlobalFlags(fs, true, true) }

// commandGlobalFlags defines the global flags a command uses on its flag
// set: --database-url with database, --schema with schema.
func (e *env) commandGlobalFlags(fs *flag.FlagSet, database, schema bool) {
	if e.schema == "" {
		e.schema = schemaDefault
	}
	if database {
		fs.StringVar(&e.databaseURL, "database-url", e.databaseURL,
			"PostgreSQL URL; else $PGONCE_DATABASE_URL, else $DATABASE_URL, else "+databaseURLDefault)
		fs.StringVar(&e.pooling, "pooling", e.pooling,
			"how the URL's server pools connections: session, or transaction (PgBouncer in transaction mode); else $PGONCE_POOLING, else session")
	}
	if schema {
		fs.StringVar(&e.schema, "schema", e.schema, "schema that holds pgonce's tables")
	}
}

// resolveURL returns the URL to connect to and where it came from.
func (e *env) resolveURL() (databaseURL, source string) {
	for _, candidate := range []struct{ value, source string }{
		{e.databaseURL, "--database-url"},
		{os.Getenv("PGONCE_DATABASE_URL"), "$PGONCE_DATABASE_URL"},
		{os.Getenv("DATABASE_URL"), "$DATABASE_URL"},
	} {
		if candidate.value != "" {
			return candidate.value, candidate.source
		}
	}
	return databaseURLDefault, "the default"
}

// resolvePooling returns the pooling mode of the server at the URL, from
// --pooling, else $PGONCE_POOLING, else session.
func (e *env) resolvePooling() (outbox.Pooling, error) {
	value, source := e.pooling, "--pooling"
	if value == "" {
		value, source = os.Getenv("PGONCE_POOLING"), "$PGONCE_POOLING"
	}
	switch value {
	case "", "session":
		return outbox.PoolingSession, nil
	case "transaction":
		return outbox.PoolingTransaction, nil
	}
	return 0, usageErrorf("%s: %q is not a pooling mode: want session or transaction", source, value)
}

// conn is an open connection to the database, with pgonce's schema checked.
type conn struct {
	pool    *pgxpool.Pool
	db      *sql.DB // over pool, for the migrations
	schema  string
	pooling outbox.Pooling
}

func (c *conn) close() {
	_ = c.db.Close()
	c.pool.Close()
}

// client returns an outbox client over the connection.
func (c *conn) client(config outbox.Config) (*outbox.Client[pgx.Tx], error) {
	config.Schema = c.schema
	config.Pooling = c.pooling
	return outbox.NewPgx(c.pool, config)
}

// migratedClient connects, checks that the schema is migrated, and returns
// the connection and a client with no tools over it: what the operator
// commands need. The caller closes the connection.
func (e *env) migratedClient(ctx context.Context) (*conn, *outbox.Client[pgx.Tx], error) {
	c, err := e.connectMigrated(ctx)
	if err != nil {
		return nil, nil, err
	}
	client, err := c.client(outbox.Config{Logger: e.logger()})
	if err != nil {
		c.close()
		return nil, nil, err
	}
	return c, client, nil
}

// connect opens a pool and checks that the server answers. The schema name
// is validated first: a bad name is a usage error, whatever the database.
func (e *env) connect(ctx context.Context) (*conn, error) {
	databaseURL, source := e.resolveURL()
	return e.connectTo(ctx, databaseURL, source, e.schema)
}

// connectTo is connect to databaseURL, which came from source, with schema.
func (e *env) connectTo(ctx context.Context, databaseURL, source, schema string) (*conn, error) {
	if err := validateSchema(schema); err != nil {
		return nil, err
	}
	pooling, err := e.resolvePooling()
	if err != nil {
		return nil, err
	}
	config, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, usageErrorf("invalid database URL from %s: %v", source, err)
	}
	if pooling == outbox.PoolingTransaction && config.ConnConfig.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement {
		// A transaction pooler hands each transaction another server
		// connection: statements prepared on one are unknown on the next.
		// The URL may choose another mode that prepares nothing
		// (default_query_exec_mode=simple_protocol); the default one does.
		config.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	config.MaxConns = 8
	if config.ConnConfig.ConnectTimeout == 0 {
		config.ConnConfig.ConnectTimeout = connectTimeout
	}
	pool, err := pgxpool.NewWithConfig(ctx, config)
	if err != nil {
		return nil, usageErrorf("invalid database URL from %s: %v", source, err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, &unreachableError{url: redact(databaseURL), source: source, err: err}
	}
	return &conn{pool: pool, db: stdlib.OpenDBFromPool(pool), schema: schema, pooling: pooling}, nil
}

// connectMigrated is connect, then a read-only check that the schema is
// migrated to the version this binary knows.
func (e *env) connectMigrated(ctx context.Context) (*conn, error) {
	databaseURL, source := e.resolveURL()
	return e.connectMigratedTo(ctx, databaseURL, source, e.schema)
}

// connectMigratedTo is connectMigrated to databaseURL, which came from
// source, with schema.
func (e *env) connectMigratedTo(ctx context.Context, databaseURL, source, schema string) (*conn, error) {
	c, err := e.connectTo(ctx, databaseURL, source, schema)
	if err != nil {
		return nil, err
	}
	current, latest, err := migrations.Version(ctx, c.db, c.schema)
	if err == nil {
		if current < latest {
			err = &notMigratedError{schema: c.schema, current: current, latest: latest}
		}
	}
	if err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

// migrationFiles maps each embedded migration's version to its file name.
func migrationFiles() map[int64]string {
	names, _ := fs.Glob(migrations.FS, "*.sql")
	files := make(map[int64]string, len(names))
	for _, name := range names {
		if version, err := goose.NumericComponent(name); err == nil {
			files[version] = name
		}
	}
	return files
}

func validateSchema(schema string) error {
	if err := migrations.ValidateSchema(schema); err != nil {
		return usageErrorf("--schema: %v", err)
	}
	return nil
}

// logger drops the library's logs below warnings; the commands report
// what matters themselves.
func (e *env) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// exitError carries an exit code and a message for the person at the
// terminal.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

func usageErrorf(format string, args ...any) error {
	return &exitError{code: exitUsage, msg: fmt.Sprintf(format, args...)}
}

// attentionError ends a command that printed its findings with exitAttention.
func attentionError(msg string) error {
	return &exitError{code: exitAttention, msg: msg}
}

type unreachableError struct {
	url, source string
	err         error
}

func (e *unreachableError) Error() string {
	// A server that answered and refused needs another fix than one that
	// never answered.
	var pgErr *pgconn.PgError
	if errors.As(e.err, &pgErr) {
		switch {
		case pgErr.Code == "3D000": // invalid_catalog_name
			return fmt.Sprintf("PostgreSQL at %s (from %s) has no such database: %s\n"+
				"Create it (createdb, or CREATE DATABASE) or point --database-url, PGONCE_DATABASE_URL or DATABASE_URL at one that exists.",
				e.url, e.source, pgErr.Message)
		case pgErr.Code == "28000", pgErr.Code == "28P01": // invalid_authorization_specification, invalid_password
			return fmt.Sprintf("PostgreSQL at %s (from %s) refused the login: %s\n"+
				"Check the user and password in the URL (the role must exist and be allowed by pg_hba.conf).",
				e.url, e.source, pgErr.Message)
		case pgErr.Code == "53300": // too_many_connections
			return fmt.Sprintf("PostgreSQL at %s (from %s) has no connection to spare: %s\nTry again, or raise max_connections.",
				e.url, e.source, pgErr.Message)
		case strings.HasPrefix(pgErr.Code, "57P"): // shutting down, starting up
			return fmt.Sprintf("PostgreSQL at %s (from %s) is not accepting connections yet: %s\nTry again once it has started.",
				e.url, e.source, pgErr.Message)
		}
		return fmt.Sprintf("PostgreSQL at %s (from %s) refused the connection: %v", e.url, e.source, e.err)
	}
	return fmt.Sprintf("cannot reach PostgreSQL at %s (from %s): %v\n"+
		"Start a server (for example: docker run -d -p 5432:5432 -e POSTGRES_HOST_AUTH_METHOD=trust postgres:16)\n"+
		"or point --database-url, PGONCE_DATABASE_URL or DATABASE_URL at one.",
		e.url, e.source, e.err)
}

type notMigratedError struct {
	schema          string
	current, latest int64
}

func (e *notMigratedError) Error() string {
	state := "is not migrated"
	if e.current > 0 {
		state = fmt.Sprintf("is migrated to version %d of %d", e.current, e.latest)
	}
	return fmt.Sprintf("schema %s %s: run `pgonce --schema %s migrate up`", e.schema, state, e.schema)
}

// exit prints err for a person and returns the exit code.
func (e *env) exit(command string, err error) int {
	if err == nil {
		return exitOK
	}
	code, msg := classify(err, e.schema)
	fmt.Fprintf(e.stderr, "pgonce %s: %s\n", command, msg)
	return code
}

// classify maps an error to an exit code and a message a person can act on.
func classify(err error, schema string) (int, string) {
	var (
		exitErr *exitError
		pgErr   *pgconn.PgError
	)
	switch {
	case errors.As(err, &exitErr):
		return exitErr.code, exitErr.msg
	case errors.Is(err, outbox.ErrNotFound):
		return exitNotFound, fmt.Sprintf("%v (schema %s)", err, schema)
	case errors.Is(err, outbox.ErrInvalidKey), errors.Is(err, outbox.ErrInvalidResolution),
		errors.Is(err, outbox.ErrInvalidRegistration), errors.Is(err, outbox.ErrInvalidSchema):
		return exitUsage, err.Error()
	case errors.Is(err, outbox.ErrNotNeedsReview), errors.Is(err, outbox.ErrExpired):
		return exitRefused, err.Error()
	case errors.Is(err, outbox.ErrNotMigrated):
		return exitFailure, err.Error()
	case errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000"):
		// undefined_table, invalid_schema_name: the schema went away or was
		// never migrated after the check at connect.
		return exitFailure, (&notMigratedError{schema: schema}).Error()
	case errors.Is(err, context.Canceled):
		return exitFailure, "interrupted"
	}
	return exitFailure, err.Error()
}

// redact hides a URL's password.
func redact(databaseURL string) string {
	u, err := url.Parse(databaseURL)
	if err != nil || u.Scheme == "" {
		if strings.Contains(databaseURL, "password") {
			return "(a connection string with a password)"
		}
		return databaseURL
	}
	return u.Redacted()
}
