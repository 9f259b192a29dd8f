package migrations_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"fmt"
	"os"
	"strings"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/pressly/goose/v3"

	"github.com/pgonce/pgonce/migrations"
)

// ExampleNewProvider runs pgonce's migrations through goose's own
// provider, for tooling that already drives goose: the version table is
// pgonce_db_version inside the schema, apart from yours.
func ExampleNewProvider() {
	ctx := context.Background()

	// The database: PGONCE_TEST_DATABASE_URL, as pgonce's own tests use it.
	db, err := sql.Open("pgx", cmp.Or(os.Getenv("PGONCE_TEST_DATABASE_URL"),
		"postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"))
	if err != nil {
		panic(err)
	}
	defer func() { _ = db.Close() }()

	// A schema of its own, so that examples running at once never meet.
	schema := "example_" + strings.ToLower(rand.Text())
	defer func() {
		_, _ = db.ExecContext(context.WithoutCancel(ctx), `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`)
	}()

	// Never call provider.Close: it would close db, which is yours.
	provider, err := migrations.NewProvider(db, schema, goose.WithVerbose(false))
	if err != nil {
		panic(err)
	}
	fmt.Println("first:", provider.ListSources()[0].Path)
	results, err := provider.Up(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Printf("applied all: %t\n", len(results) == len(provider.ListSources()))
	pending, err := provider.HasPending(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Printf("pending: %t\n", pending)

	// Output:
	// first: 00001_create_pgonce_tables.sql
	// applied all: true
	// pending: false
}
