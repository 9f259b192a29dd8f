package outbox_test

import (
	"context"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
)

func TestList(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testList[pgx.Tx], testList[*sql.Tx])
}

// listAll pages through params with a page size of limit and returns every
// key listed, failing on a key listed twice.
func listAll[TTx any](t *testing.T, client *outbox.Client[TTx], params outbox.ListParams, limit int) []outbox.ListedKey {
	t.Helper()
	params.Limit = limit
	var all []outbox.ListedKey
	seen := map[outbox.Key]bool{}
	for page := 0; ; page++ {
		require.Less(t, page, 1000, "the listing never ends")
		res, err := client.List(t.Context(), params)
		require.NoError(t, err)
		require.LessOrEqual(t, len(res.Keys), limit)
		for _, k := range res.Keys {
			require.False(t, seen[k.Key], "key %s listed twice", k.Key)
			seen[k.Key] = true
		}
		all = append(all, res.Keys...)
		if res.Cursor == "" {
			return all
		}
		params.Cursor = res.Cursor
	}
}

func keysOf(listed []outbox.ListedKey) []outbox.Key {
	keys := make([]outbox.Key, len(listed))
	for i, k := range listed {
		keys[i] = k.Key
	}
	return keys
}

func testList[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Run("FiltersByStateToolTenantRunAndTime", func(t *testing.T) {
		t.Parallel()
		b := opsSetup(t, driver)
		ctx := t.Context()

		// Pending: five refunds of run-a in one transaction (one created_at,
		// so that the key breaks the ties), two of tenant t2.
		var pendingCalls []outbox.Call
		for i := range 5 {
			call := outbox.Call{RunID: "run-a", Step: int64(i), Tool: "refund", Args: map[string]any{"i": i}}
			if i < 2 {
				call.Tenant = "t2"
			}
			pendingCalls = append(pendingCalls, call)
		}
		pending := b.driver.SubmitKeys(t, b.client, pendingCalls)

		// Needs review: an at-most-once email whose attempt was uncertain.
		b.provider.err = outbox.Ambiguous(errors.New("timeout after send"))
		review, _ := b.client.Do(ctx, outbox.Call{RunID: "run-b", Step: 1, Tool: "email", Args: map[string]any{"to": "x"}}, nil)
		require.Equal(t, outbox.StateNeedsReview, review.State)
		// Failed: a permanent refund failure.
		b.provider.err = outbox.Permanent(errors.New("declined"))
		failed, err := b.client.Do(ctx, outbox.Call{RunID: "run-b", Step: 2, Tool: "refund", Args: map[string]any{"i": 9}}, nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateFailed, failed.State)
		// Cancelled.
		b.provider.err = nil
		toCancel, err := b.client.Submit(ctx, outbox.Call{RunID: "run-b", Step: 3, Tool: "refund", Args: map[string]any{"i": 10}})
		require.NoError(t, err)
		_, err = b.client.Cancel(ctx, toCancel.Key, cancelBy)
		require.NoError(t, err)
		// Succeeded: never listed.
		_, err = b.client.Do(ctx, outbox.Call{RunID: "run-b", Step: 4, Tool: "refund", Args: map[string]any{"i": 11}}, nil)
		require.NoError(t, err)

		all := listAll(t, b.client, outbox.ListParams{}, 2)
		require.Len(t, all, 8, "every listable key, and no succeeded one")
		for i := 1; i < len(all); i++ {
			prev, cur := all[i-1], all[i]
			require.True(t, prev.CreatedAt.Before(cur.CreatedAt) ||
				(prev.CreatedAt.Equal(cur.CreatedAt) && prev.Key < cur.Key), "oldest first, then by key")
		}

		reviewed := listAll(t, b.client, outbox.ListParams{States: []outbox.State{outbox.StateNeedsReview}, Tool: "email"}, 10)
		require.Equal(t, []outbox.Key{review.Key}, keysOf(reviewed))
		require.Equal(t, "run-b", reviewed[0].RunID)
		require.Equal(t, outbox.StateNeedsReview, reviewed[0].State)

		none := listAll(t, b.client, outbox.ListParams{States: []outbox.State{outbox.StateNeedsReview}, Tool: "refund"}, 10)
		require.Empty(t, none)

		pendingListed := listAll(t, b.client, outbox.ListParams{States: []outbox.State{outbox.StatePending}}, 2)
		require.ElementsMatch(t, pending, keysOf(pendingListed))
		for _, k := range pendingListed {
			require.Equal(t, outbox.StatePending, k.State)
		}
		inTenant := listAll(t, b.client, outbox.ListParams{Tenant: "t2"}, 10)
		require.ElementsMatch(t, pending[:2], keysOf(inTenant))
		byRun := listAll(t, b.client, outbox.ListParams{RunID: "run-b", States: []outbox.State{outbox.StateFailed, outbox.StateCancelled}}, 1)
		require.ElementsMatch(t, []outbox.Key{failed.Key, toCancel.Key}, keysOf(byRun))

		cut := all[5].CreatedAt
		before := listAll(t, b.client, outbox.ListParams{CreatedBefore: cut}, 3)
		after := listAll(t, b.client, outbox.ListParams{CreatedAfter: cut}, 3)
		require.Len(t, append(before, after...), 8, "[after, before) ranges split the listing")
		for _, k := range before {
			require.True(t, k.CreatedAt.Before(cut))
		}
	})

	t.Run("RefusesBadParams", func(t *testing.T) {
		t.Parallel()
		b := opsSetup(t, driver)
		for name, params := range map[string]outbox.ListParams{
			"Succeeded":   {States: []outbox.State{outbox.StateSucceeded}},
			"Expired":     {States: []outbox.State{outbox.StateExpired}},
			"Unknown":     {States: []outbox.State{"done"}},
			"LimitTooBig": {Limit: outbox.ListLimitMax + 1},
			"Negative":    {Limit: -1},
			"BadCursor":   {Cursor: "c1_!!"},
			"NotACursor":  {Cursor: "k1_00"},
		} {
			_, err := b.client.List(t.Context(), params)
			require.ErrorIs(t, err, outbox.ErrInvalidParams, name)
		}
	})
}

// listTracer keeps the text and arguments of the last KeyList statement a
// pool ran.
type listTracer struct {
	mu   sync.Mutex
	sql  string
	args []any
}

func (lt *listTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.Contains(data.SQL, "-- name: KeyList") {
		lt.mu.Lock()
		lt.sql, lt.args = data.SQL, data.Args
		lt.mu.Unlock()
	}
	return ctx
}

func (lt *listTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (lt *listTracer) last() (string, []any) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	return lt.sql, lt.args
}

// sqlLiteral writes a KeyList argument as SQL text, for EXPLAIN EXECUTE.
func sqlLiteral(t *testing.T, arg any) string {
	t.Helper()
	switch v := arg.(type) {
	case nil:
		return "NULL"
	case *time.Time:
		if v == nil {
			return "NULL"
		}
		return sqlLiteral(t, *v)
	case time.Time:
		return "'" + v.UTC().Format(time.RFC3339Nano) + "'"
	case *string:
		if v == nil {
			return "NULL"
		}
		return sqlLiteral(t, *v)
	case string:
		return "'" + strings.ReplaceAll(v, "'", "''") + "'"
	case []byte:
		return `'\x` + hex.EncodeToString(v) + "'"
	case bool, int32, int64, int:
		return fmt.Sprint(v)
	}
	t.Fatalf("no literal for %T", arg)
	return ""
}

// TestListPlanAtOneMillionKeys builds a key table of a million keys by SQL
// (990,000 succeeded, 5,000 failed, 4,000 pending, 1,000 in needs review,
// across two tools) and shows that List reads pgonce_key_list_idx, not the
// table, on both drivers: in the plan a one-off statement gets, and in the
// generic plan a cached prepared statement may switch to.
func TestListPlanAtOneMillionKeys(t *testing.T) {
	t.Parallel()
	schema := pgoncetest.Schema(t)
	// The test's context lasts until its parallel subtests end; no
	// deadline of its own, which a busy machine would overrun.
	ctx := t.Context()
	pool := pgoncetest.Pool(t)
	quoted := `"` + schema + `"`
	_, err := pool.Exec(ctx, `
INSERT INTO `+quoted+`.pgonce_key (
    key, scope, run_id, step, tool, args, state, attempt, response, failure,
    created_at, available_at, updated_at, completed_at, expires_at, forget_at
)
SELECT
    sha256(int8send(i)),
    sha256(int8send(-i)),
    'run-' || (i / 100),
    i,
    CASE WHEN i % 2 = 0 THEN 'refund' ELSE 'email' END,
    '{}'::bytea,
    s.state::`+quoted+`.pgonce_state,
    CASE WHEN s.state = 'open' THEN 0 ELSE 1 END,
    CASE WHEN s.state = 'succeeded' THEN '{}'::bytea END,
    CASE WHEN s.state = 'failed' THEN '{}'::bytea END,
    now() - (1000000 - i) * interval '1 second',
    CASE WHEN s.state = 'open' THEN now() END,
    CASE WHEN s.state IN ('open', 'needs_review') THEN now() END,
    CASE WHEN s.state IN ('succeeded', 'failed') THEN now() END,
    CASE WHEN s.state IN ('succeeded', 'failed') THEN now() + interval '30 days' END,
    CASE WHEN s.state IN ('succeeded', 'failed') THEN now() + interval '365 days' END
FROM generate_series(1, 1000000) AS i
CROSS JOIN LATERAL (
    SELECT CASE
        WHEN i % 1000 = 1 THEN 'needs_review'
        WHEN i % 1000 BETWEEN 2 AND 5 THEN 'open'
        WHEN i % 1000 BETWEEN 6 AND 10 THEN 'failed'
        ELSE 'succeeded'
    END AS state
) AS s`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE `+quoted+`.pgonce_key`)
	require.NoError(t, err)
	var listed, indexBytes int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), pg_relation_size('`+quoted+`.pgonce_key_list_idx')
		FROM `+quoted+`.pgonce_key WHERE state NOT IN ('succeeded', 'expired')`).Scan(&listed, &indexBytes))
	t.Logf("pgonce_key_list_idx: %d bytes for %d listable keys of 1000000, %.1f bytes per listable key",
		indexBytes, listed, float64(indexBytes)/float64(listed))

	// Each driver's client runs on a pool of its own, whose tracer keeps
	// the statement List ran.
	tracedPool := func(t *testing.T) (*pgxpool.Pool, *listTracer) {
		t.Helper()
		config, err := pgxpool.ParseConfig(pgoncetest.DatabaseURL(t))
		require.NoError(t, err)
		tracer := &listTracer{}
		config.ConnConfig.Tracer = tracer
		config.MaxConns = 4
		traced, err := pgxpool.NewWithConfig(ctx, config)
		require.NoError(t, err)
		t.Cleanup(traced.Close)
		return traced, tracer
	}

	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("refund", &recordingProvider{}, outbox.IdempotentByKey))
	explain := func(t *testing.T, traced *pgxpool.Pool, tracer *listTracer, list func(outbox.ListParams) (outbox.ListResult, error)) {
		t.Helper()
		for name, params := range map[string]outbox.ListParams{
			"NeedsReviewOfOneTool": {States: []outbox.State{outbox.StateNeedsReview}, Tool: "email", Limit: 50},
			"EveryListableState":   {Limit: 100},
			"RunInTimeRange": {
				RunID: "run-5000", CreatedAfter: time.Now().Add(-600000 * time.Second),
				CreatedBefore: time.Now().Add(-400000 * time.Second),
			},
		} {
			first, err := list(params)
			require.NoError(t, err, name)
			if params.RunID == "" {
				require.NotEmpty(t, first.Keys, name)
				require.NotEmpty(t, first.Cursor, name)
				params.Cursor = first.Cursor // a page deep in the listing
				_, err = list(params)
				require.NoError(t, err, name)
			}
			statement, args := tracer.last()
			require.NotEmpty(t, statement)

			var plan []string
			rows, err := traced.Query(ctx, "EXPLAIN "+statement, args...)
			require.NoError(t, err)
			for rows.Next() {
				var line string
				require.NoError(t, rows.Scan(&line))
				plan = append(plan, line)
			}
			require.NoError(t, rows.Err())
			requireListPlan(t, name+" (one-off plan)", plan)

			literals := make([]string, len(args))
			for i, arg := range args {
				literals[i] = sqlLiteral(t, arg)
			}
			conn, err := traced.Acquire(ctx)
			require.NoError(t, err)
			var generic []string
			func() {
				defer conn.Release()
				name := "pgonce_list_plan"
				_, err := conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan")
				require.NoError(t, err)
				defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), "DEALLOCATE "+name+"; RESET plan_cache_mode") }()
				_, err = conn.Exec(ctx, "PREPARE "+name+" AS "+statement)
				require.NoError(t, err)
				rows, err := conn.Query(ctx, "EXPLAIN EXECUTE "+name+"("+strings.Join(literals, ", ")+")",
					pgx.QueryExecModeSimpleProtocol)
				require.NoError(t, err)
				for rows.Next() {
					var line string
					require.NoError(t, rows.Scan(&line))
					generic = append(generic, line)
				}
				require.NoError(t, rows.Err())
			}()
			requireListPlan(t, name+" (generic plan)", generic)
		}
	}
	t.Run(drivertest.NamePgx, func(t *testing.T) {
		t.Parallel()
		traced, tracer := tracedPool(t)
		client := drivertest.Pgx().ClientOver(t, traced, outbox.Config{Schema: schema, Registry: registry})
		explain(t, traced, tracer, func(p outbox.ListParams) (outbox.ListResult, error) { return client.List(ctx, p) })
	})
	t.Run(drivertest.NameDatabaseSQL, func(t *testing.T) {
		t.Parallel()
		traced, tracer := tracedPool(t)
		client := drivertest.DatabaseSQL().ClientOver(t, traced, outbox.Config{Schema: schema, Registry: registry})
		explain(t, traced, tracer, func(p outbox.ListParams) (outbox.ListResult, error) { return client.List(ctx, p) })
	})
}

func requireListPlan(t *testing.T, name string, plan []string) {
	t.Helper()
	text := strings.Join(plan, "\n")
	t.Logf("%s:\n%s", name, text)
	require.Contains(t, text, "pgonce_key_list_idx", name)
	require.NotContains(t, text, "Seq Scan on pgonce_key", name)
}
