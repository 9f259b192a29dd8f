package pgoncetest

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgonce/pgonce/internal/ident"
)

// EffectTable creates, in schema, the table that drivertest's
// EffectProvider writes its effects to, one row per effect (the key and the
// attempt that wrote it, no uniqueness), and returns its quoted name.
func EffectTable(tb testing.TB, schema string) string {
	tb.Helper()
	table := ident.Quote(schema) + ".pgonce_test_effect"
	if _, err := DB(tb).ExecContext(context.Background(),
		"CREATE TABLE "+table+" (key text NOT NULL, attempt integer NOT NULL)"); err != nil {
		tb.Fatalf("create effect table: %v", err)
	}
	return table
}

// CountEffects returns how many effect rows table holds for key.
func CountEffects[K ~string](tb testing.TB, table string, key K) int {
	tb.Helper()
	var n int
	if err := DB(tb).QueryRowContext(context.Background(),
		"SELECT count(*) FROM "+table+" WHERE key = $1", string(key)).Scan(&n); err != nil {
		tb.Fatalf("count effects: %v", err)
	}
	return n
}

// ExecTx runs query with args in tx, a pgx.Tx or a *sql.Tx.
func ExecTx(ctx context.Context, tx any, query string, args ...any) error {
	switch tx := tx.(type) {
	case pgx.Tx:
		_, err := tx.Exec(ctx, query, args...)
		return err
	case *sql.Tx:
		_, err := tx.ExecContext(ctx, query, args...)
		return err
	}
	return fmt.Errorf("pgoncetest: %T is not a transaction", tx)
}
