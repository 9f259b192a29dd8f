// Package exampledb gives pgonce's runnable programs (examples/) and the
// Example functions of its packages a database and a migrated schema of
// their own. Library code never imports it.
package exampledb

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/migrations"
)

const (
	// URLDefault is the database of a developer's machine: a PostgreSQL on
	// 127.0.0.1:5432 that trusts local connections.
	URLDefault = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	// URLEnv names the variable a program reads its database URL from
	// first, as the pgonce command does.
	URLEnv = "PGONCE_DATABASE_URL"
	// URLFallbackEnv names the variable a program reads its database URL
	// from when URLEnv is unset.
	URLFallbackEnv = "DATABASE_URL"
	// TestURLEnv names the variable that points the tests, and so the
	// Example functions, at a database (as internal/pgoncetest reads it).
	TestURLEnv = "PGONCE_TEST_DATABASE_URL"

	// connectTimeout bounds connecting and migrating, so that a server that
	// does not answer is reported instead of waited for.
	connectTimeout = 30 * time.Second
)

// ErrSchemaInUse is returned by [Open] for a schema that exists and was not
// made by the same example: an example never drops what it did not create.
var ErrSchemaInUse = errors.New("schema exists and was not made by this example")

// URL returns the database URL of a program: $PGONCE_DATABASE_URL, else
// $DATABASE_URL, else [URLDefault].
func URL() string {
	return cmp.Or(os.Getenv(URLEnv), os.Getenv(URLFallbackEnv), URLDefault)
}

// DB is a connection pool and a migrated schema that belongs to one example.
type DB struct {
	// Pool is the pgx pool; SQL is a database/sql handle over the same pool.
	Pool *pgxpool.Pool
	SQL  *sql.DB
	// Schema holds pgonce's tables and the example's own.
	Schema string

	owner string
}

// Open connects to url and makes schema the example owner's: it creates the
// schema, marks it as owner's with a comment, and migrates it. A schema that
// an earlier run of the same example left behind (one interrupted before it
// could drop it) is dropped first; any other existing schema is refused with
// [ErrSchemaInUse], so that pointing an example at a schema that holds data
// never loses it.
func Open(ctx context.Context, url, schema, owner string) (*DB, error) {
	db, err := Connect(ctx, url, schema)
	if err != nil {
		return nil, err
	}
	db.owner = owner
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := db.create(ctx); err != nil {
		db.close()
		return nil, err
	}
	if err := migrations.Up(ctx, db.SQL, schema); err != nil {
		db.close()
		return nil, fmt.Errorf("migrate schema %s: %w", schema, err)
	}
	return db, nil
}

// Connect connects to url for a schema that [Open] made, in another
// process of the same example. Closing it leaves the schema in place.
func Connect(ctx context.Context, url, schema string) (*DB, error) {
	if err := migrations.ValidateSchema(schema); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to %s: %w (set %s to your database's URL)", redact(url), err, URLFallbackEnv)
	}
	return &DB{Pool: pool, SQL: stdlib.OpenDBFromPool(pool), Schema: schema}, nil
}

// Table returns the schema-qualified, quoted name of the example's table
// name, for the SQL of the example's own tables.
func (db *DB) Table(name string) string {
	return ident.Quote(db.Schema) + "." + ident.Quote(name)
}

// Close drops the schema with everything in it when [Open] made it, and
// closes the connections.
func (db *DB) Close(ctx context.Context) error {
	defer db.close()
	if db.owner == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), connectTimeout)
	defer cancel()
	if _, err := db.Pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+ident.Quote(db.Schema)+" CASCADE"); err != nil {
		return fmt.Errorf("drop schema %s: %w", db.Schema, err)
	}
	return nil
}

// Keep makes [DB.Close] leave the schema in place.
func (db *DB) Keep() { db.owner = "" }

func (db *DB) close() {
	_ = db.SQL.Close()
	db.Pool.Close()
}

// create creates the schema and marks it as the owner's, in one
// transaction; it drops the schema first if an earlier run of the same
// example left it.
func (db *DB) create(ctx context.Context) error {
	mark := "made by the pgonce example " + db.owner + "; dropped when it ends"
	quoted := ident.Quote(db.Schema)
	return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		var comment *string
		err := tx.QueryRow(ctx, `SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = $1`,
			db.Schema).Scan(&comment)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return fmt.Errorf("look for schema %s: %w", db.Schema, err)
		case comment == nil || *comment != mark:
			return fmt.Errorf("%w: %s (choose another with -schema)", ErrSchemaInUse, db.Schema)
		default:
			if _, err := tx.Exec(ctx, "DROP SCHEMA "+quoted+" CASCADE"); err != nil {
				return fmt.Errorf("drop the schema an earlier run left, %s: %w", db.Schema, err)
			}
		}
		if _, err := tx.Exec(ctx, "CREATE SCHEMA "+quoted); err != nil {
			return fmt.Errorf("create schema %s: %w", db.Schema, err)
		}
		// COMMENT takes no parameters; the mark is a constant of ours but
		// for the owner's name, which the examples spell.
		if _, err := tx.Exec(ctx, "COMMENT ON SCHEMA "+quoted+" IS "+quoteLiteral(mark)); err != nil {
			return fmt.Errorf("mark schema %s: %w", db.Schema, err)
		}
		return nil
	})
}

// ForExample opens a fresh schema, with a random name, on the tests'
// database ($PGONCE_TEST_DATABASE_URL, else [URLDefault]) for an Example
// function, which has no *testing.T: it panics on error, and done drops the
// schema and closes the connections.
func ForExample() (db *DB, done func()) {
	var suffix [6]byte
	_, _ = rand.Read(suffix[:])
	name := "example_" + hex.EncodeToString(suffix[:])
	db, err := Open(context.Background(), cmp.Or(os.Getenv(TestURLEnv), URLDefault), name, name)
	if err != nil {
		panic(err)
	}
	return db, func() {
		if err := db.Close(context.Background()); err != nil {
			panic(err)
		}
	}
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string {
	out := []byte{'\''}
	for i := range len(s) {
		if s[i] == '\'' {
			out = append(out, '\'')
		}
		out = append(out, s[i])
	}
	return string(append(out, '\''))
}

// redact drops the password from url for an error message.
func redact(url string) string {
	config, err := pgx.ParseConfig(url)
	if err != nil {
		return "the database"
	}
	return fmt.Sprintf("%s@%s:%d/%s", config.User, config.Host, config.Port, config.Database)
}
