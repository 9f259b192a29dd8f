package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/store"
)

// statementRecorder is a pgx tracer that keeps the text and arguments of
// the last statement named by each sqlc name it is asked for.
type statementRecorder struct {
	mu    sync.Mutex
	names []string
	seen  map[string]pgx.TraceQueryStartData
}

func (r *statementRecorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, name := range r.names {
		if strings.HasPrefix(data.SQL, "-- name: "+name+" ") {
			r.seen[name] = data
		}
	}
	return ctx
}

func (r *statementRecorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart, TraceBatchQuery and TraceBatchEnd record the statements
// a pipeline sends, as TraceQueryStart records those sent alone.
func (r *statementRecorder) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (r *statementRecorder) TraceBatchQuery(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchQueryData) {
	r.TraceQueryStart(ctx, conn, pgx.TraceQueryStartData{SQL: data.SQL, Args: data.Args})
}

func (r *statementRecorder) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (r *statementRecorder) statement(t *testing.T, name string) pgx.TraceQueryStartData {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	data, ok := r.seen[name]
	require.True(t, ok, "no %s ran", name)
	return data
}

// genericPlan returns the generic plan, as EXPLAIN's JSON, that a prepared
// statement of data's text gets with data's arguments: the plan pgx's
// statement cache ends up running once PostgreSQL stops planning it for
// each execution's values.
func genericPlan(t *testing.T, pool *pgxpool.Pool, data pgx.TraceQueryStartData) string {
	t.Helper()
	ctx := t.Context()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan")
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), "DEALLOCATE planned; RESET plan_cache_mode") }()
	_, err = conn.Exec(ctx, "PREPARE planned AS "+data.SQL)
	require.NoError(t, err)
	placeholders := make([]string, len(data.Args))
	for i := range data.Args {
		placeholders[i] = "$" + strconv.Itoa(i+1)
	}
	// EXECUTE takes its arguments as literals: the simple protocol writes
	// them into the text.
	args := append([]any{pgx.QueryExecModeSimpleProtocol}, data.Args...)
	var plan string
	err = conn.QueryRow(ctx, "EXPLAIN (FORMAT JSON) EXECUTE planned("+strings.Join(placeholders, ", ")+")", args...).Scan(&plan)
	require.NoError(t, err)
	return plan
}

// planNode is a node of EXPLAIN's JSON.
type planNode struct {
	NodeType     string     `json:"Node Type"`
	Relationship string     `json:"Parent Relationship"`
	Relation     string     `json:"Relation Name"`
	Index        string     `json:"Index Name"`
	Plans        []planNode `json:"Plans"`
}

// walk calls fn on node and every node below it.
func (node planNode) walk(fn func(planNode)) {
	fn(node)
	for _, child := range node.Plans {
		child.walk(fn)
	}
}

// TestBatchesProbeTheScopeIndex checks the generic plans of the statements
// that record a batch of outcomes: no plan rescans the outcomes for each row
// of the table (every nested loop reads the table on its inner side, a probe
// per outcome), and a table of any size past a few pages is read through
// the unique scope index, which the outcomes carry. Driven from the lease index or a scan of the table, whose
// statistics (taken, as here, while nothing was in flight) promised one
// row, they rescanned every outcome for every leased key: a quadratic join
// that took 53 ms for 256 outcomes against 5–8 ms.
func TestBatchesProbeTheScopeIndex(t *testing.T) {
	t.Parallel()

	for _, finished := range []int{0, 20_000} {
		t.Run(fmt.Sprintf("Finished%d", finished), func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()

			config, err := pgxpool.ParseConfig(pgoncetest.DatabaseURL(t))
			require.NoError(t, err)
			recorder := &statementRecorder{names: []string{"OutboxFinish", "OutboxRelease"}, seen: map[string]pgx.TraceQueryStartData{}}
			config.ConnConfig.Tracer = recorder
			config.MaxConns = 2
			pool, err := pgxpool.NewWithConfig(ctx, config)
			require.NoError(t, err)
			t.Cleanup(pool.Close)

			schema := pgoncetest.Schema(t)
			table := pgx.Identifier{schema, "pgonce_key"}.Sanitize()
			driver, err := store.NewPgxDriver(pool, schema)
			require.NoError(t, err)
			s := driver.Store()

			// Finished keys of another tool, then the pending keys the
			// batches claim; statistics taken before any claim.
			_, err = pool.Exec(ctx, `INSERT INTO `+table+` (key, scope, run_id, step, tool, args, state, available_at, updated_at,
					response, completed_at, expires_at, forget_at)
				SELECT sha256(convert_to('done/' || i, 'UTF8')), sha256(convert_to('scope/done/' || i, 'UTF8')), 'done', i, 'other', '{}',
					'succeeded', NULL, NULL, '{}', now(), now() + interval '1 day', now() + interval '2 days'
				FROM generate_series(1, $1::bigint) AS i`, finished)
			require.NoError(t, err)
			const keys = 400
			for n := range keys {
				_, err := s.Executor().KeyInsert(ctx, newKey(n))
				require.NoError(t, err)
			}
			_, err = pool.Exec(ctx, "ANALYZE "+table)
			require.NoError(t, err)

			claim := func() []*store.ClaimedKey {
				t.Helper()
				claimed, err := s.ClaimBatch(ctx, &store.ClaimBatchParams{Tools: []string{"refund"}, Max: keys / 2, Lease: time.Minute, Worker: "planner"})
				require.NoError(t, err)
				require.Len(t, claimed, keys/2)
				return claimed
			}
			finish := &store.FinishParams{TombstoneRetention: time.Hour}
			for _, c := range claim() {
				finish.Outcomes = append(finish.Outcomes, store.Outcome{Key: c.Key, Scope: c.Scope, Attempt: c.Attempt, State: "succeeded", Response: []byte(`{}`), Retention: time.Hour})
			}
			written, err := s.Finish(ctx, finish)
			require.NoError(t, err)
			require.Len(t, written, keys/2)
			release := &store.ReleaseParams{}
			for _, c := range claim() {
				release.Releases = append(release.Releases, store.Release{Key: c.Key, Scope: c.Scope, Attempt: c.Attempt, Delay: time.Second})
			}
			written, err = s.Release(ctx, release)
			require.NoError(t, err)
			require.Len(t, written, keys/2)

			for _, name := range recorder.names {
				text := genericPlan(t, pool, recorder.statement(t, name))
				var plans []struct{ Plan planNode }
				require.NoError(t, json.Unmarshal([]byte(text), &plans))
				require.Len(t, plans, 1)
				scopeIndex := false
				plans[0].Plan.walk(func(node planNode) {
					scopeIndex = scopeIndex || node.Index == "pgonce_key_scope_key"
					require.NotEqual(t, "pgonce_key_lease_idx", node.Index, "%s: the join is driven from the lease index:\n%s", name, text)
					if node.NodeType == "Nested Loop" {
						inner := node.Plans[1]
						require.Equal(t, "pgonce_key", inner.Relation, "%s: a nested loop rescans the outcomes for each row of the table:\n%s", name, text)
					}
				})
				if finished > 0 {
					require.True(t, scopeIndex, "%s: each outcome probes the scope index:\n%s", name, text)
				}
			}
		})
	}
}
