package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
)

// trueKeyCounts counts a schema's keys per tool and state by reading the
// whole table, as the truth Stats must agree with.
func trueKeyCounts(t *testing.T, ctx context.Context, schema string) map[string]map[outbox.State]int64 {
	t.Helper()
	rows, err := pgoncetest.Pool(t).Query(ctx, `
		SELECT coalesce(tool, ''),
			CASE WHEN state = 'open' AND lease_until IS NOT NULL THEN 'in_flight'
				WHEN state = 'open' THEN 'pending' ELSE state::text END,
			count(*)
		FROM `+ident.Quote(schema)+`.pgonce_key GROUP BY 1, 2`)
	require.NoError(t, err)
	counts := map[string]map[outbox.State]int64{}
	for rows.Next() {
		var tool, state string
		var n int64
		require.NoError(t, rows.Scan(&tool, &state, &n))
		if counts[tool] == nil {
			counts[tool] = map[outbox.State]int64{}
		}
		counts[tool][outbox.State(state)] = n
	}
	require.NoError(t, rows.Err())
	return counts
}

// trueOldestPending reads, per tool with a pending key, when its oldest due
// pending key became due, by the database's clock; the zero time when none
// of its pending keys is due.
func trueOldestPending(t *testing.T, ctx context.Context, schema string) map[string]time.Time {
	t.Helper()
	rows, err := pgoncetest.Pool(t).Query(ctx, `
		SELECT tool, min(available_at) FILTER (WHERE available_at <= now())
		FROM `+ident.Quote(schema)+`.pgonce_key WHERE state = 'open' AND lease_until IS NULL GROUP BY 1`)
	require.NoError(t, err)
	oldest := map[string]time.Time{}
	for rows.Next() {
		var tool string
		var at *time.Time
		require.NoError(t, rows.Scan(&tool, &at))
		oldest[tool] = time.Time{}
		if at != nil {
			oldest[tool] = *at
		}
	}
	require.NoError(t, rows.Err())
	return oldest
}

// databaseClock reads the database's clock now.
func databaseClock(t *testing.T, ctx context.Context) time.Time {
	t.Helper()
	var now time.Time
	require.NoError(t, pgoncetest.Pool(t).QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now))
	return now
}

// requireWaitedSince requires that age is how long ago since was at some
// instant of the database's clock between before and after (read around
// the statement that measured age), give or take the millisecond the
// statement rounds to. Bounds, not a tolerance: a statement delayed by a
// loaded machine still measures within them.
func requireWaitedSince(t *testing.T, age time.Duration, since, before, after time.Time, msgAndArgs ...any) {
	t.Helper()
	require.GreaterOrEqual(t, age, before.Sub(since)-time.Millisecond, msgAndArgs...)
	require.LessOrEqual(t, age, after.Sub(since)+time.Millisecond, msgAndArgs...)
}

func TestStatsEveryState(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testStatsEveryState[pgx.Tx], testStatsEveryState[*sql.Tx])
}

func testStatsEveryState[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Run("ExactInASmallTable", func(t *testing.T) {
		t.Parallel()
		b := opsSetup(t, driver)
		ctx := t.Context()
		quoted := ident.Quote(b.schema)
		pool := pgoncetest.Pool(t)
		refund := func(step int64) outbox.Call {
			return outbox.Call{RunID: "run-stats", Step: step, Tool: "refund", Args: map[string]any{"i": step}}
		}
		email := func(step int64) outbox.Call {
			return outbox.Call{RunID: "run-stats", Step: step, Tool: "email", Args: map[string]any{"i": step}}
		}

		// Pending: three refunds, the oldest due an hour ago; two emails,
		// neither due yet.
		pending := b.driver.SubmitKeys(t, b.client, []outbox.Call{refund(1), refund(2), refund(3)})
		var dueSince time.Time
		err := pool.QueryRow(ctx, `UPDATE `+quoted+`.pgonce_key SET available_at = now() - interval '1 hour' WHERE key = $1
			RETURNING available_at`, pgoncetest.StoredKey(t, string(pending[0]))).Scan(&dueSince)
		require.NoError(t, err)
		for step := int64(20); step < 22; step++ {
			call := email(step)
			call.Delay = time.Hour
			_, err := b.client.Submit(ctx, call)
			require.NoError(t, err)
		}
		// In flight: two refunds, one of them with an expired lease.
		inFlight := b.driver.SubmitKeys(t, b.client, []outbox.Call{refund(4), refund(5)})
		pgoncetest.AbandonKeys(t, b.schema, time.Minute, inFlight[0])
		pgoncetest.AbandonKeys(t, b.schema, -time.Hour, inFlight[1])
		// Succeeded: four refunds, two of them then pruned to tombstones.
		var succeeded []outbox.Key
		for step := int64(6); step < 10; step++ {
			res, err := b.client.Do(ctx, refund(step), nil)
			require.NoError(t, err)
			require.Equal(t, outbox.StateSucceeded, res.State)
			succeeded = append(succeeded, res.Key)
		}
		for _, key := range succeeded[:2] {
			_, err := pool.Exec(ctx, pgoncetest.TombstoneStatement(b.schema), pgoncetest.StoredKey(t, string(key)), nil)
			require.NoError(t, err)
		}
		// Failed, needs review, cancelled.
		b.provider.err = outbox.Permanent(errors.New("declined"))
		failed, err := b.client.Do(ctx, refund(10), nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateFailed, failed.State)
		b.provider.err = outbox.Ambiguous(errors.New("timeout after send"))
		review, _ := b.client.Do(ctx, email(11), nil)
		require.Equal(t, outbox.StateNeedsReview, review.State)
		b.provider.err = nil
		toCancel, err := b.client.Submit(ctx, email(12))
		require.NoError(t, err)
		_, err = b.client.Cancel(ctx, toCancel.Key, cancelBy)
		require.NoError(t, err)

		before := databaseClock(t, ctx)
		stats, err := b.client.Stats(ctx)
		require.NoError(t, err)
		after := databaseClock(t, ctx)
		require.Equal(t, map[string]map[outbox.State]int64{
			"refund": {
				outbox.StatePending: 3, outbox.StateInFlight: 2, outbox.StateSucceeded: 2, outbox.StateFailed: 1,
			},
			"email": {outbox.StatePending: 2, outbox.StateNeedsReview: 1, outbox.StateCancelled: 1},
			"":      {outbox.StateExpired: 2},
		}, stats.Keys)
		require.Equal(t, trueKeyCounts(t, ctx, b.schema), stats.Keys)
		require.Empty(t, stats.Estimated, "a small table is counted exactly")
		require.False(t, stats.IsEstimated(outbox.StateSucceeded))
		require.Equal(t, int64(5), stats.Pending)
		require.Equal(t, int64(2), stats.InFlight)
		require.Equal(t, int64(1), stats.ExpiredLeases)
		require.Equal(t, int64(1), stats.NeedsReview)
		require.Equal(t, int64(2), stats.Tombstones)

		require.Len(t, stats.OldestPendingByTool, 2)
		require.Zero(t, stats.OldestPendingByTool["email"], "no email is due yet")
		require.GreaterOrEqual(t, stats.OldestPendingByTool["refund"], time.Hour)
		requireWaitedSince(t, stats.OldestPendingByTool["refund"], dueSince, before, after, "oldest pending refund")
		requireWaitedSince(t, stats.OldestPending, dueSince, before, after, "oldest pending key")
	})
}

// statsTracer keeps the text and arguments of the last run of each
// statement a pool ran, by the statement's name.
type statsTracer struct {
	mu         sync.Mutex
	statements map[string]tracedStatement
}

type tracedStatement struct {
	sql  string
	args []any
}

func (st *statsTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if _, rest, ok := strings.Cut(data.SQL, "-- name: "); ok {
		name, _, _ := strings.Cut(rest, " ")
		st.mu.Lock()
		st.statements[name] = tracedStatement{sql: data.SQL, args: data.Args}
		st.mu.Unlock()
	}
	return ctx
}

func (st *statsTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (st *statsTracer) reset() map[string]tracedStatement {
	st.mu.Lock()
	defer st.mu.Unlock()
	ran := st.statements
	st.statements = map[string]tracedStatement{}
	return ran
}

// TestStatsPlanAtOneMillionKeys builds a key table of a million keys by SQL
// across three tools (about 80 % succeeded, 19 % tombstones, and pending,
// in-flight, failed, needs-review and cancelled keys) and shows that Stats
// never reads the table whole, on both drivers: no statement it runs has a
// sequential scan of pgonce_key, in the plan a one-off statement gets or in
// the generic plan a cached prepared statement may switch to; the exact
// counts come from pgonce_key_list_idx and the oldest pending keys from
// pgonce_key_due_idx. The exact figures match the truth counted by a
// sequential scan, and the estimated ones come within 5 % of it.
func TestStatsPlanAtOneMillionKeys(t *testing.T) {
	t.Parallel()
	schema := pgoncetest.Schema(t)
	// The test's context lasts until its parallel subtests end; no
	// deadline of its own, which a busy machine would overrun.
	ctx := t.Context()
	millionKeys(t, ctx, schema)
	truth := trueKeyCounts(t, ctx, schema)
	oldest := trueOldestPending(t, ctx, schema)

	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("refund", &recordingProvider{}, outbox.IdempotentByKey))

	check := func(t *testing.T, traced *pgxpool.Pool, tracer *statsTracer, statsFunc func() (outbox.Stats, error)) {
		t.Helper()
		tracer.reset()
		before := databaseClock(t, ctx)
		stats, err := statsFunc()
		require.NoError(t, err)
		after := databaseClock(t, ctx)
		ran := tracer.reset()

		require.Equal(t, []outbox.State{outbox.StateSucceeded, outbox.StateExpired}, stats.Estimated)
		require.True(t, stats.IsEstimated(outbox.StateExpired))
		require.False(t, stats.IsEstimated(outbox.StateNeedsReview))
		require.Len(t, stats.Keys, len(truth))
		for tool, counts := range truth {
			for state, want := range counts {
				got := stats.Keys[tool][state]
				if stats.IsEstimated(state) {
					require.InEpsilon(t, want, got, 0.05, "%s %s: estimated %d, true %d", tool, state, got, want)
					t.Logf("%s %s: estimated %d, true %d", tool, state, got, want)
				} else {
					require.Equal(t, want, got, "%s %s", tool, state)
				}
			}
			require.Len(t, stats.Keys[tool], len(counts), tool)
		}
		require.InEpsilon(t, truth[""][outbox.StateExpired], stats.Tombstones, 0.05)
		require.Equal(t, truth["email"][outbox.StateNeedsReview]+truth["refund"][outbox.StateNeedsReview]+
			truth["sms"][outbox.StateNeedsReview], stats.NeedsReview)
		require.Len(t, stats.OldestPendingByTool, len(oldest))
		for tool, dueSince := range oldest {
			if dueSince.IsZero() {
				require.Zero(t, stats.OldestPendingByTool[tool], tool)
				continue
			}
			requireWaitedSince(t, stats.OldestPendingByTool[tool], dueSince, before, after, tool)
		}

		require.NotContains(t, ran, "KeyCountByToolAndState", "a large table is never counted whole")
		for _, name := range []string{"StatsKeyTable", "StatsToolFractions", "StatsKeyCountListed", "StatsOldestPendingByTool", "OutboxStats"} {
			require.Contains(t, ran, name)
		}
		for name, statement := range ran {
			oneOff, generic := explainBoth(t, ctx, traced, statement)
			for _, plan := range []struct{ kind, text string }{{"one-off plan", oneOff}, {"generic plan", generic}} {
				t.Logf("%s (%s):\n%s", name, plan.kind, plan.text)
				require.NotContains(t, plan.text, "Seq Scan on pgonce_key", "%s (%s)", name, plan.kind)
				switch name {
				case "StatsKeyCountListed":
					require.Contains(t, plan.text, "pgonce_key_list_idx", "%s (%s)", name, plan.kind)
				case "StatsOldestPendingByTool":
					require.Contains(t, plan.text, "pgonce_key_due_idx", "%s (%s)", name, plan.kind)
				}
			}
		}
	}
	t.Run(drivertest.NamePgx, func(t *testing.T) {
		t.Parallel()
		traced, tracer := tracedPool(t, ctx)
		client := drivertest.Pgx().ClientOver(t, traced, outbox.Config{Schema: schema, Registry: registry})
		check(t, traced, tracer, func() (outbox.Stats, error) { return client.Stats(ctx) })
	})
	t.Run(drivertest.NameDatabaseSQL, func(t *testing.T) {
		t.Parallel()
		traced, tracer := tracedPool(t, ctx)
		client := drivertest.DatabaseSQL().ClientOver(t, traced, outbox.Config{Schema: schema, Registry: registry})
		check(t, traced, tracer, func() (outbox.Stats, error) { return client.Stats(ctx) })
	})
}

// millionKeys fills schema's key table by SQL with a million keys across
// three tools, and analyzes it (see fillKeys).
func millionKeys(t *testing.T, ctx context.Context, schema string) {
	t.Helper()
	fillKeys(t, ctx, schema, 1000000)
}

// fillKeys fills schema's key table by SQL with n keys across three tools,
// and analyzes it: in every thousand keys, 1 needs review, 4 are pending
// (one of them due only in an hour) and 1 in flight, 4 failed, 1
// cancelled, 189 tombstones and the rest succeeded. Run ids group keys by
// the hundred (run-0, run-1, …), and steps are the keys' numbers.
func fillKeys(tb testing.TB, ctx context.Context, schema string, n int) {
	tb.Helper()
	pool := pgoncetest.Pool(tb)
	quoted := ident.Quote(schema)
	_, err := pool.Exec(ctx, `
INSERT INTO `+quoted+`.pgonce_key (
    key, scope, run_id, step, tool, args, state, attempt, response, failure,
    created_at, available_at, lease_until, worker, updated_at, completed_at, expires_at, forget_at, expired_state
)
SELECT
    sha256(int8send(i)),
    sha256(int8send(-i)),
    CASE WHEN s.state <> 'expired' THEN 'run-' || (i / 100) END,
    CASE WHEN s.state <> 'expired' THEN i END,
    CASE WHEN s.state = 'expired' THEN NULL WHEN i % 3 = 0 THEN 'refund' WHEN i % 3 = 1 THEN 'email' ELSE 'sms' END,
    CASE WHEN s.state <> 'expired' THEN '{}'::bytea END,
    s.state::`+quoted+`.pgonce_state,
    CASE WHEN s.state = 'open' AND NOT s.leased THEN 0 ELSE 1 END,
    CASE WHEN s.state = 'succeeded' THEN '{}'::bytea END,
    CASE WHEN s.state = 'failed' THEN '{}'::bytea END,
    now() - ($1::bigint - i) * interval '1 second',
    -- Pending keys: most due up to a day ago, some due in an hour.
    CASE WHEN s.state = 'open' THEN now() + CASE WHEN i % 1000 = 5 THEN interval '1 hour'
        ELSE -(i % 86400) * interval '1 second' END END,
    CASE WHEN s.leased THEN now() + interval '1 minute' END,
    CASE WHEN s.leased THEN 'worker' END,
    CASE WHEN s.state IN ('open', 'needs_review') THEN now() END,
    CASE WHEN s.state NOT IN ('open', 'needs_review') THEN now() END,
    CASE WHEN s.state IN ('succeeded', 'failed', 'cancelled') THEN now() + interval '30 days' END,
    CASE WHEN s.state NOT IN ('open', 'needs_review') THEN now() + interval '365 days' END,
    CASE WHEN s.state = 'expired' THEN 'succeeded'::`+quoted+`.pgonce_state END
FROM generate_series(1, $1::bigint) AS i
CROSS JOIN LATERAL (
    SELECT CASE
        WHEN i % 1000 = 1 THEN 'needs_review'
        WHEN i % 1000 BETWEEN 2 AND 6 THEN 'open'
        WHEN i % 1000 BETWEEN 7 AND 10 THEN 'failed'
        WHEN i % 1000 = 11 THEN 'cancelled'
        WHEN i % 1000 BETWEEN 12 AND 200 THEN 'expired'
        ELSE 'succeeded'
    END AS state, i % 1000 = 6 AS leased
) AS s`, n)
	require.NoError(tb, err)
	_, err = pool.Exec(ctx, `ANALYZE `+quoted+`.pgonce_key`)
	require.NoError(tb, err)
}

// tracedPool returns a pool of its own whose tracer keeps the statements
// it ran.
func tracedPool(t *testing.T, ctx context.Context) (*pgxpool.Pool, *statsTracer) {
	t.Helper()
	config, err := pgxpool.ParseConfig(pgoncetest.DatabaseURL(t))
	require.NoError(t, err)
	tracer := &statsTracer{statements: map[string]tracedStatement{}}
	config.ConnConfig.Tracer = tracer
	config.MaxConns = 2
	traced, err := pgxpool.NewWithConfig(ctx, config)
	require.NoError(t, err)
	t.Cleanup(traced.Close)
	return traced, tracer
}

// explainBoth returns the plan a traced statement gets run once with its
// arguments, and its generic plan, which a cached prepared statement may
// switch to.
func explainBoth(t *testing.T, ctx context.Context, traced *pgxpool.Pool, statement tracedStatement) (oneOff, generic string) {
	t.Helper()
	lines := func(rows pgx.Rows, err error) string {
		require.NoError(t, err)
		var plan []string
		for rows.Next() {
			var line string
			require.NoError(t, rows.Scan(&line))
			plan = append(plan, line)
		}
		require.NoError(t, rows.Err())
		return strings.Join(plan, "\n")
	}
	oneOff = lines(traced.Query(ctx, "EXPLAIN "+statement.sql, statement.args...))

	literals := make([]string, len(statement.args))
	for i, arg := range statement.args {
		if tools, ok := arg.([]string); ok {
			quoted := make([]string, len(tools))
			for j, tool := range tools {
				quoted[j] = sqlLiteral(t, tool)
			}
			literals[i] = "ARRAY[" + strings.Join(quoted, ", ") + "]::text[]"
			continue
		}
		literals[i] = sqlLiteral(t, arg)
	}
	conn, err := traced.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	name := "pgonce_stats_plan"
	_, err = conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan")
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), "DEALLOCATE "+name+"; RESET plan_cache_mode") }()
	_, err = conn.Exec(ctx, "PREPARE "+name+" AS "+statement.sql)
	require.NoError(t, err)
	execute := "EXPLAIN EXECUTE " + name
	if len(literals) > 0 {
		execute += "(" + strings.Join(literals, ", ") + ")"
	}
	generic = lines(conn.Query(ctx, execute, pgx.QueryExecModeSimpleProtocol))
	return oneOff, generic
}
