package pgoncetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgonce/pgonce/internal/ident"
)

// ShiftedClockPool returns a pool over the test database whose sessions see
// the database's clock moved by offset, as if the database host's clock
// were off: now() resolves, through search_path, to a function in a schema
// made for tb that adds offset to pg_catalog.now(). pgonce's statements
// qualify their tables and call now() unqualified, so a client over this
// pool writes and compares every timestamp on the shifted clock while the
// local clock stays where it is. The pool and the schema go when tb ends.
func ShiftedClockPool(tb testing.TB, offset time.Duration) *pgxpool.Pool {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema := NewSchemaName(tb)
	_, err := Pool(tb).Exec(ctx, fmt.Sprintf(`
		CREATE SCHEMA %[1]s;
		CREATE FUNCTION %[1]s.now() RETURNS timestamptz
			LANGUAGE sql STABLE
			AS $$ SELECT pg_catalog.now() + %[2]d * interval '1 microsecond' $$;`,
		ident.Quote(schema), offset.Microseconds()))
	if err != nil {
		tb.Fatalf("create shifted clock: %v", err)
	}
	tb.Cleanup(func() { DropSchema(tb, schema) })
	config, err := pgxpool.ParseConfig(DatabaseURL(tb))
	if err != nil {
		tb.Fatalf("parse database url: %v", err)
	}
	config.ConnConfig.RuntimeParams["search_path"] = ident.Quote(schema) + ", pg_catalog"
	config.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, config)
	if err != nil {
		tb.Fatalf("connect with shifted clock: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}
