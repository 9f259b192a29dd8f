package store_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/store"
)

// TestControlledClaimKeepsTheTokensThatAccrueDuringIt checks the rate
// bucket across controlled claims on the database's own clock: after each
// claim the bucket holds what it held after the one before, plus the rate
// times the time between their refills, less what the claim took. A claim
// that refilled the bucket up to one instant of its clock but stamped it
// with a later one lost the tokens of the time in between, at every claim:
// a rate that dispatchers claiming often could not reach.
func TestControlledClaimKeepsTheTokensThatAccrueDuringIt(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgoncetest.Pool(t)
	schema := pgoncetest.Schema(t)
	driver, err := store.NewPgxDriver(pool, schema)
	require.NoError(t, err)
	s := driver.Store()
	for n := range 200 {
		_, err := s.Executor().KeyInsert(ctx, newKey(n))
		require.NoError(t, err)
	}
	// A rate high enough that a microsecond is worth a thousandth of a
	// token, and a burst the test never fills: the bucket is never capped.
	rate, burst := 1000.0, 1_000_000
	_, err = s.ToolSetLimits(ctx, &store.ToolActParams{Tool: "refund", Rate: &rate, Burst: &burst, By: "test", Reason: "bucket"})
	require.NoError(t, err)
	tools := pgx.Identifier{schema, "pgonce_tool"}.Sanitize()
	_, err = pool.Exec(ctx, `UPDATE `+tools+` SET tokens = 0, refilled_at = clock_timestamp()`)
	require.NoError(t, err)

	bucket := func() (tokens float64, at time.Time) {
		t.Helper()
		require.NoError(t, pool.QueryRow(ctx, `SELECT tokens, refilled_at FROM `+tools+` WHERE tool = 'refund'`).Scan(&tokens, &at))
		return tokens, at
	}
	tokens, at := bucket()
	claimed := 0
	for claimed < 100 {
		rows, _, err := s.ClaimControlled(ctx, &store.ClaimBatchParams{Tools: []string{"refund"}, Max: 5, Lease: time.Minute, Worker: "test"})
		require.NoError(t, err)
		claimed += len(rows)
		nextTokens, nextAt := bucket()
		require.True(t, nextAt.After(at), "the claim refilled the bucket")
		want := tokens + rate*nextAt.Sub(at).Seconds() - float64(len(rows))
		require.InDelta(t, want, nextTokens, 1e-6,
			"tokens after a claim of %d keys, %s after the claim before", len(rows), nextAt.Sub(at))
		tokens, at = nextTokens, nextAt
	}
}
