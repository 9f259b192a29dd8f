package pgoncetest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// KillablePool returns a pool of its own over the test database, whose
// connections carry an application_name unique to tb, and a function that
// terminates the server side of every connection of that pool, as an
// administrator's pg_terminate_backend or a server restart does, and waits
// until they are gone. The pool finds out only when it next uses a
// connection (SQLSTATE 57P01, or a closed socket): it never pings an idle
// connection before handing it out, so the next statement meets the dead
// connection. The pool closes when tb ends.
func KillablePool(tb testing.TB) (pool *pgxpool.Pool, kill func(ctx context.Context) error) {
	tb.Helper()
	name := NewSchemaName(tb)
	config, err := pgxpool.ParseConfig(DatabaseURL(tb))
	if err != nil {
		tb.Fatalf("parse database url: %v", err)
	}
	config.ConnConfig.RuntimeParams["application_name"] = name
	config.ConnConfig.RuntimeParams["search_path"] = ""
	config.MaxConns = 8
	config.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err = pgxpool.NewWithConfig(ctx, config)
	if err != nil {
		tb.Fatalf("connect: %v", err)
	}
	tb.Cleanup(pool.Close)
	kill = func(ctx context.Context) error {
		_, err := Pool(tb).Exec(ctx, `SELECT pg_terminate_backend(pid, 10000)
			FROM pg_stat_activity WHERE application_name = $1`, name)
		return err
	}
	return pool, kill
}
