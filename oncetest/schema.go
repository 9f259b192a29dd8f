package oncetest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/migrations"
)

// SchemaPrefix begins the name of every schema [Schema] creates, so that
// schemas left by a killed test run are easy to find and drop.
const SchemaPrefix = "oncetest_"

// schemaTimeout bounds migrating and dropping a test schema.
const schemaTimeout = time.Minute

// Schema creates a schema unique to tb in db's database, migrates it with
// [migrations.Up], and drops it with everything in it when tb ends. Pass the
// name as [outbox.Config.Schema]. It fails tb when the database cannot be
// reached or the schema cannot be created.
//
// db must use pgx's stdlib driver, as [outbox.New] requires.
func Schema(tb testing.TB, db *sql.DB) string {
	tb.Helper()
	var suffix [8]byte
	_, _ = rand.Read(suffix[:])
	schema := SchemaPrefix + hex.EncodeToString(suffix[:])

	ctx, cancel := context.WithTimeout(context.Background(), schemaTimeout)
	defer cancel()
	// Registered before migrating, so that a half-made schema goes too.
	tb.Cleanup(func() {
		// The test's context is done by now; the drop gets its own.
		ctx, cancel := context.WithTimeout(context.Background(), schemaTimeout)
		defer cancel()
		if _, err := db.ExecContext(ctx, "DROP SCHEMA IF EXISTS "+ident.Quote(schema)+" CASCADE"); err != nil {
			tb.Errorf("oncetest: drop schema %s: %v", schema, err)
		}
	})
	if err := migrations.Up(ctx, db, schema); err != nil {
		tb.Fatalf("oncetest: migrate schema %s: %v", schema, err)
	}
	return schema
}

// SchemaPgx is [Schema] for a pgx pool.
func SchemaPgx(tb testing.TB, pool *pgxpool.Pool) string {
	tb.Helper()
	// Closing a *sql.DB over a pool leaves the pool open.
	db := stdlib.OpenDBFromPool(pool)
	tb.Cleanup(func() { _ = db.Close() })
	return Schema(tb, db)
}
