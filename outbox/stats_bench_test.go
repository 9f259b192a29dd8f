package outbox_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

// statsBenchKeysEnv sets how many keys BenchmarkStats fills its table with.
const statsBenchKeysEnv = "PGONCE_BENCH_STATS_KEYS"

// BenchmarkStats times Client.Stats on a key table of
// $PGONCE_BENCH_STATS_KEYS keys (default 100,000; see fillKeys), beside
// the statement Stats ran before it estimated, which counts every key of
// the table: what the estimates save.
func BenchmarkStats(b *testing.B) {
	keys := 100000
	if v := os.Getenv(statsBenchKeysEnv); v != "" {
		var err error
		keys, err = strconv.Atoi(v)
		require.NoError(b, err, statsBenchKeysEnv)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	schema := pgoncetest.Schema(b)
	fillKeys(b, ctx, schema, keys)
	client, err := outbox.NewPgx(pgoncetest.Pool(b), outbox.Config{Schema: schema})
	require.NoError(b, err)

	b.Run("Stats", func(b *testing.B) {
		for b.Loop() {
			stats, err := client.Stats(ctx)
			require.NoError(b, err)
			require.NotEmpty(b, stats.Keys)
		}
	})
	b.Run("CountEveryKey", func(b *testing.B) {
		pool := pgoncetest.Pool(b)
		for b.Loop() {
			rows, err := pool.Query(ctx, `SELECT coalesce(tool, ''),
					CASE WHEN state = 'open' AND lease_until IS NOT NULL THEN 'in_flight'
						WHEN state = 'open' THEN 'pending' ELSE state::text END,
					count(*)
				FROM `+ident.Quote(schema)+`.pgonce_key GROUP BY 1, 2`)
			require.NoError(b, err)
			rows.Close()
			require.NoError(b, rows.Err())
		}
	})
}
