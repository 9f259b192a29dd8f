package migrations_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/pgonce/pgonce/migrations"
)

// ExampleUp migrates pgonce's schema at start-up, and checks it the way a
// service that leaves migrations to a deploy step would: Version reads the
// applied and the embedded version and writes nothing.
func ExampleUp() {
	ctx := context.Background()

	// The database: PGONCE_TEST_DATABASE_URL, as pgonce's own tests use it.
	// pgx users pass stdlib.OpenDBFromPool(pool) instead.
	db, err := sql.Open("pgx", cmp.Or(os.Getenv("PGONCE_TEST_DATABASE_URL"),
		"postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"))
	if err != nil {
		panic(err)
	}
	defer func() { _ = db.Close() }()

	// A schema of its own, so that examples running at once never meet; a
	// service migrates "pgonce" (migrations.SchemaDefault).
	schema := "example_" + strings.ToLower(rand.Text())
	defer func() {
		_, _ = db.ExecContext(context.WithoutCancel(ctx), `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`)
	}()

	current, latest, err := migrations.Version(ctx, db, schema)
	if err != nil {
		panic(err)
	}
	fmt.Printf("before: applied=%d behind=%t\n", current, current < latest)

	// Idempotent, and safe from several processes at once: one migrates
	// while the others wait for it.
	if err := migrations.Up(ctx, db, schema); err != nil {
		panic(err)
	}
	if err := migrations.Up(ctx, db, schema); err != nil {
		panic(err)
	}
	current, latest, err = migrations.Version(ctx, db, schema)
	if err != nil {
		panic(err)
	}
	fmt.Printf("after:  up to date=%t\n", current == latest)

	// A schema name that is not a plain lower-case identifier is refused
	// before any SQL runs.
	err = migrations.Up(ctx, db, `pgonce"; DROP TABLE users; --`)
	fmt.Printf("invalid schema refused=%t\n", errors.Is(err, migrations.ErrInvalidSchema))

	// Output:
	// before: applied=0 behind=true
	// after:  up to date=true
	// invalid schema refused=true
}
