package store_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/store"
)

// explainPrepared returns the plan, as EXPLAIN's JSON, of a prepared
// statement of data's text run with data's arguments, under mode, a
// plan_cache_mode: force_custom_plan plans for the arguments given,
// force_generic_plan for any.
func explainPrepared(t *testing.T, pool *pgxpool.Pool, data pgx.TraceQueryStartData, mode string) (planNode, string) {
	t.Helper()
	ctx := t.Context()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "SET plan_cache_mode = "+mode)
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), "DEALLOCATE explained; RESET plan_cache_mode") }()
	_, err = conn.Exec(ctx, "PREPARE explained AS "+data.SQL)
	require.NoError(t, err)
	placeholders := make([]string, len(data.Args))
	for i := range data.Args {
		placeholders[i] = "$" + strconv.Itoa(i+1)
	}
	// EXECUTE takes its arguments as literals: the simple protocol writes
	// them into the text.
	args := append([]any{pgx.QueryExecModeSimpleProtocol}, data.Args...)
	var text string
	err = conn.QueryRow(ctx, "EXPLAIN (FORMAT JSON) EXECUTE explained("+strings.Join(placeholders, ", ")+")", args...).Scan(&text)
	require.NoError(t, err)
	var plans []struct{ Plan planNode }
	require.NoError(t, json.Unmarshal([]byte(text), &plans))
	require.Len(t, plans, 1)
	return plans[0].Plan, text
}

// TestDispatchPlansNeverScanTheKeyTable checks the plans of the statements
// that claim, complete, release and reclaim keys on a table of 10^5 keys
// that was never analyzed (autovacuum is off for it, as on a busy table
// between two runs of autovacuum): whether custom or generic, no plan reads
// the whole key table. Without statistics a match on one key was estimated
// at 0.5 % of the table, and OutboxFinish ran as a hash join over a
// sequential scan of it: 30–97 ms a batch.
func TestDispatchPlansNeverScanTheKeyTable(t *testing.T) {
	t.Parallel()
	ctx := t.Context()

	names := []string{
		"OutboxClaimBatch", "OutboxClaimKey", "OutboxFinish", "OutboxRelease",
		"OutboxReclaimExpired", "OutboxRecordedAttempts", "KeyGet", "KeyGetByKeyOrScope",
	}
	config, err := pgxpool.ParseConfig(pgoncetest.DatabaseURL(t))
	require.NoError(t, err)
	recorder := &statementRecorder{names: names, seen: map[string]pgx.TraceQueryStartData{}}
	config.ConnConfig.Tracer = recorder
	config.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, config)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	schema := pgoncetest.Schema(t)
	table := pgx.Identifier{schema, "pgonce_key"}.Sanitize()
	_, err = pool.Exec(ctx, "ALTER TABLE "+table+" SET (autovacuum_enabled = false)")
	require.NoError(t, err)
	driver, err := store.NewPgxDriver(pool, schema)
	require.NoError(t, err)
	s := driver.Store()
	exec := s.Executor()

	_, err = pool.Exec(ctx, `INSERT INTO `+table+` (key, scope, run_id, step, tool, args, state, available_at, updated_at,
			response, completed_at, expires_at, forget_at)
		SELECT sha256(convert_to('done/' || i, 'UTF8')), sha256(convert_to('scope/done/' || i, 'UTF8')), 'done', i, 'other', '{}',
			'succeeded', NULL, NULL, '{}', now(), now() + interval '1 day', now() + interval '2 days'
		FROM generate_series(1, 100000) AS i`)
	require.NoError(t, err)
	const keys = 300
	for n := range keys {
		_, err := exec.KeyInsert(ctx, newKey(n))
		require.NoError(t, err)
	}

	claim := func(max int) []*store.ClaimedKey {
		t.Helper()
		claimed, err := s.ClaimBatch(ctx, &store.ClaimBatchParams{Tools: []string{"refund"}, Max: max, Lease: time.Minute, Worker: "planner"})
		require.NoError(t, err)
		require.Len(t, claimed, max)
		return claimed
	}
	finish := &store.FinishParams{TombstoneRetention: time.Hour}
	for _, c := range claim(100) {
		finish.Outcomes = append(finish.Outcomes, store.Outcome{Key: c.Key, Scope: c.Scope, Attempt: c.Attempt, State: "succeeded", Response: []byte(`{}`), Retention: time.Hour})
	}
	written, err := s.Finish(ctx, finish)
	require.NoError(t, err)
	require.Len(t, written, 100)
	var recorded []store.AttemptRef
	release := &store.ReleaseParams{}
	for _, c := range claim(100) {
		release.Releases = append(release.Releases, store.Release{Key: c.Key, Scope: c.Scope, Attempt: c.Attempt, Delay: time.Second})
		recorded = append(recorded, store.AttemptRef{Key: c.Key, Scope: c.Scope, Attempt: c.Attempt})
	}
	written, err = s.Release(ctx, release)
	require.NoError(t, err)
	require.Len(t, written, 100)
	_, err = s.RecordedAttempts(ctx, recorded)
	require.NoError(t, err)
	claim(50)
	later := time.Now().Add(time.Hour)
	reclaimed, err := s.ReclaimExpired(ctx, &store.ReclaimExpiredParams{Tools: []string{"refund"}, Max: 50, Lease: time.Minute, Worker: "reconciler", Now: &later})
	require.NoError(t, err)
	require.Len(t, reclaimed, 50)
	pending := newKey(keys - 1)
	_, err = s.ClaimKey(ctx, &store.ClaimKeyParams{Key: pending.Key, Lease: time.Minute, Worker: "inline"})
	require.NoError(t, err)
	_, err = exec.KeyGet(ctx, pending.Key, nil)
	require.NoError(t, err)
	_, err = exec.KeyGetByKeyOrScope(ctx, pending.Key, pending.Scope, nil)
	require.NoError(t, err)

	var analyzed int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_user_tables
		WHERE schemaname = $1 AND relname = 'pgonce_key' AND (last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL)`, schema).Scan(&analyzed))
	require.Zero(t, analyzed, "the key table was analyzed")

	var scans []string
	for _, name := range names {
		for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
			plan, text := explainPrepared(t, pool, recorder.statement(t, name), mode)
			plan.walk(func(node planNode) {
				if node.NodeType == "Seq Scan" && node.Relation == "pgonce_key" {
					t.Logf("%s (%s) reads the whole key table:\n%s", name, mode, text)
					scans = append(scans, name+" ("+mode+")")
				}
			})
		}
	}
	require.Empty(t, scans, "plans that read the whole key table")
}
