package outbox_test

import (
	"database/sql"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

func TestSubmitManyTx(t *testing.T) {
	t.Parallel()
	eachHarness(t, testSubmitManyTx[pgx.Tx], testSubmitManyTx[*sql.Tx])
}

func testSubmitManyTx[TTx any](t *testing.T, h driverHarness[TTx]) {
	t.Helper()

	type testBundle struct {
		client *outbox.Client[TTx]
		schema string
	}

	setup := func(t *testing.T) *testBundle {
		t.Helper()
		schema := pgoncetest.Schema(t)
		provider := &countingProvider{response: json.RawMessage(`{"refund_id":"re_1"}`)}
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", provider, outbox.IdempotentByKey))
		require.NoError(t, registry.Register("email", provider, outbox.AtMostOnce))
		return &testBundle{client: h.newClient(t, outbox.Config{Schema: schema, Registry: registry}), schema: schema}
	}
	refund := func(runID string, step int64, amount string) outbox.Call {
		return outbox.Call{RunID: runID, Step: step, Tool: "refund", Args: json.RawMessage(`{"order": 8842, "amount": ` + amount + `}`)}
	}
	keyOf := func(t *testing.T, call outbox.Call) outbox.Key {
		t.Helper()
		key, err := outbox.DeriveKey(call)
		require.NoError(t, err)
		return key
	}

	t.Run("CreatesEveryKeyWithOneNotification", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		calls := []outbox.Call{refund("run-1", 1, "1"), refund("run-1", 2, "2"), refund("run-2", 1, "3")}
		var results []outbox.SubmitManyResult
		notified := pgoncetest.WorkNotifications(t, bundle.schema, func() {
			tx := h.begin(t, nil)
			var err error
			results, err = bundle.client.SubmitManyTx(t.Context(), tx, calls)
			require.NoError(t, err)
			require.NoError(t, h.commit(tx))
		})
		require.Equal(t, 1, notified)
		require.Len(t, results, len(calls))
		for i, res := range results {
			require.NoError(t, res.Err)
			require.True(t, res.Result.Created)
			require.Equal(t, outbox.StatePending, res.Result.State)
			require.Equal(t, keyOf(t, calls[i]), res.Result.Key)
			require.Equal(t, "refund", res.Result.Tool)
			require.Positive(t, res.Result.RetryAfter)
			got, err := bundle.client.Get(t.Context(), res.Result.Key)
			require.NoError(t, err)
			require.Equal(t, outbox.StatePending, got.State)
		}
		keys, open := rowCounts(t, bundle.schema)
		require.Equal(t, 3, keys)
		require.Equal(t, 3, open)
	})

	t.Run("AnswersExistingKeysPerCall", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		pending, err := bundle.client.Submit(t.Context(), refund("run-1", 1, "1"))
		require.NoError(t, err)
		done, err := bundle.client.Do(t.Context(), refund("run-1", 2, "2"), nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, done.State)
		business := outbox.Call{Key: "order-8842-refund", Tool: "refund", Args: json.RawMessage(`{"amount": 1}`)}
		_, err = bundle.client.Submit(t.Context(), business)
		require.NoError(t, err)

		tx := h.begin(t, nil)
		calls := []outbox.Call{
			refund("run-1", 1, "1"),  // pending: a replay
			refund("run-1", 2, "2"),  // succeeded: the stored response
			refund("run-1", 1, "99"), // the same step, other arguments
			{Key: "order-8842-refund", Tool: "refund", Args: json.RawMessage(`{"amount": 2}`)},
			refund("run-1", 3, "3"), // new
		}
		results, err := bundle.client.SubmitManyTx(t.Context(), tx, calls)
		require.NoError(t, err)
		require.NoError(t, h.commit(tx))
		require.Len(t, results, len(calls))

		require.NoError(t, results[0].Err)
		require.False(t, results[0].Result.Created)
		require.Equal(t, pending.Key, results[0].Result.Key)
		require.Equal(t, outbox.StatePending, results[0].Result.State)

		require.NoError(t, results[1].Err)
		require.False(t, results[1].Result.Created)
		require.Equal(t, outbox.StateSucceeded, results[1].Result.State)
		require.JSONEq(t, `{"refund_id":"re_1"}`, string(results[1].Result.Response))
		require.Equal(t, done.Response, results[1].Result.Response, "replayed byte for byte")

		var conflict *outbox.KeyConflictError
		require.ErrorAs(t, results[2].Err, &conflict)
		require.Equal(t, pending.Key, conflict.ExistingKey)
		require.Zero(t, results[2].Result)
		require.ErrorIs(t, results[3].Err, outbox.ErrKeyConflict)

		require.NoError(t, results[4].Err)
		require.True(t, results[4].Result.Created)
		keys, _ := rowCounts(t, bundle.schema)
		require.Equal(t, 4, keys, "one new key")
	})

	t.Run("RepeatsInsideTheBatchAnswerAsSequentialSubmits", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		call := refund("run-1", 1, "1")
		calls := []outbox.Call{call, call, refund("run-1", 1, "2"), call}
		tx := h.begin(t, nil)
		results, err := bundle.client.SubmitManyTx(t.Context(), tx, calls)
		require.NoError(t, err)

		key := keyOf(t, call)
		require.NoError(t, results[0].Err)
		require.True(t, results[0].Result.Created)
		for _, i := range []int{1, 3} {
			require.NoError(t, results[i].Err)
			require.False(t, results[i].Result.Created, "a replay of the batch's first call")
			require.Equal(t, key, results[i].Result.Key)
			require.Equal(t, outbox.StatePending, results[i].Result.State)
		}
		var conflict *outbox.KeyConflictError
		require.ErrorAs(t, results[2].Err, &conflict)
		require.Equal(t, key, conflict.ExistingKey)
		require.NoError(t, h.commit(tx))
		keys, _ := rowCounts(t, bundle.schema)
		require.Equal(t, 1, keys)
	})

	t.Run("InvalidCallNamesItsIndexAndWritesNothing", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		for _, tt := range []struct {
			name  string
			index int
			bad   outbox.Call
			want  error
		}{
			{"UnknownTool", 1, outbox.Call{RunID: "run", Step: 9, Tool: "teleport", Args: json.RawMessage(`{}`)}, outbox.ErrUnknownTool},
			{"NotCanonical", 2, outbox.Call{RunID: "run", Step: 9, Tool: "refund", Args: json.RawMessage(`{"a": 1e400}`)}, outbox.ErrNotCanonical},
			{"NoRunID", 0, outbox.Call{Step: 9, Tool: "refund", Args: json.RawMessage(`{}`)}, outbox.ErrInvalidCall},
		} {
			calls := []outbox.Call{refund("run-1", 1, "1"), refund("run-1", 2, "2"), refund("run-1", 3, "3")}
			calls[tt.index] = tt.bad
			tx := h.begin(t, nil)
			results, err := bundle.client.SubmitManyTx(t.Context(), tx, calls)
			require.Nil(t, results, tt.name)
			require.ErrorIs(t, err, tt.want, tt.name)
			var callErr *outbox.CallError
			require.ErrorAs(t, err, &callErr, tt.name)
			require.Equal(t, tt.index, callErr.Index, tt.name)
			require.Contains(t, err.Error(), "call "+string(rune('0'+tt.index))+":", tt.name)
			// The transaction is untouched: it commits, with nothing in it.
			require.NoError(t, h.commit(tx), tt.name)
		}
		keys, _ := rowCounts(t, bundle.schema)
		require.Zero(t, keys)
	})

	t.Run("RollbackLeavesNothing", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		tx := h.begin(t, nil)
		results, err := bundle.client.SubmitManyTx(t.Context(), tx, []outbox.Call{refund("run-1", 1, "1"), refund("run-1", 2, "2")})
		require.NoError(t, err)
		require.True(t, results[1].Result.Created)
		require.NoError(t, h.rollback(tx))
		keys, _ := rowCounts(t, bundle.schema)
		require.Zero(t, keys)
	})

	t.Run("NilTxAndEmptyBatch", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		var nilTx TTx
		_, err := bundle.client.SubmitManyTx(t.Context(), nilTx, []outbox.Call{refund("run-1", 1, "1")})
		require.ErrorIs(t, err, outbox.ErrInvalidTx)
		tx := h.begin(t, nil)
		results, err := bundle.client.SubmitManyTx(t.Context(), tx, nil)
		require.NoError(t, err)
		require.Empty(t, results)
		require.NoError(t, h.commit(tx))
	})

	t.Run("SubmitManyCommitsByItself", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		results, err := bundle.client.SubmitMany(t.Context(), []outbox.Call{refund("run-1", 1, "1"), refund("run-1", 1, "1")})
		require.NoError(t, err)
		require.True(t, results[0].Result.Created)
		require.False(t, results[1].Result.Created)
		got, err := bundle.client.Get(t.Context(), results[0].Result.Key)
		require.NoError(t, err)
		require.Equal(t, outbox.StatePending, got.State)
	})
}

// TestSubmitManyTxWritesWhatSubmitTxWrites submits batches of calls of
// every shape (tenants, business keys, metadata, schedules, each delivery
// mode, a key retention; and a batch with none of them) once through
// SubmitTx, one call at a time, and once through SubmitManyTx, each into a
// schema of its own under the same clock: the rows and the results are the
// same, over pgx and database/sql, in each of pgx's query exec modes, which
// send the batch's arrays each their own way.
func TestSubmitManyTxWritesWhatSubmitTxWrites(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 14, 15, 9, 26, 535000000, time.UTC)
	registry := outbox.NewRegistry()
	provider := &countingProvider{response: json.RawMessage(`{}`)}
	require.NoError(t, registry.Register("refund", provider, outbox.IdempotentByKey))
	require.NoError(t, registry.Register("lookup", &lookingUpProvider{countingProvider{}}, outbox.LookupByNaturalID))
	require.NoError(t, registry.Register("email", provider, outbox.AtMostOnce))
	require.NoError(t, registry.RegisterWithOpts("kept", provider, outbox.IdempotentByKey, &outbox.ToolOpts{KeyRetention: 36 * time.Hour}))
	batches := [][]outbox.Call{
		{
			{Tenant: "acme", RunID: "run-1", Step: 1, Tool: "refund", Args: json.RawMessage(`{"amount":1}`), Metadata: map[string]string{"trace": "t-1"}},
			{Key: "order-8842-email", Tool: "email", Args: json.RawMessage(`{"to":"a@example.com"}`), NotBefore: now.Add(time.Hour)},
			{RunID: "run-1", Step: 2, Tool: "lookup", NaturalID: "nat-1", Args: json.RawMessage(`{"n":2}`), Delay: 90 * time.Second},
			{RunID: "run-2", Step: 7, Tool: "kept", Args: json.RawMessage(`{"s":"é \" \\ ,{}"}`)},
			{Tenant: "acme", Key: "order-8842-refund", Tool: "refund", Args: json.RawMessage(`[]`), Delay: time.Millisecond},
		},
		{
			{RunID: "run-3", Step: 1, Tool: "refund", Args: json.RawMessage(`{"amount":3}`)},
			{RunID: "run-3", Step: 2, Tool: "refund", Args: json.RawMessage(`{"amount":4}`)},
		},
	}
	// rows reads schema's keys, every column, in key order.
	rows := func(t *testing.T, schema string) []string {
		t.Helper()
		query, err := pgoncetest.Pool(t).Query(t.Context(), `SELECT to_jsonb(k)::text FROM "`+schema+`".pgonce_key k ORDER BY k.key`)
		require.NoError(t, err)
		got, err := pgx.CollectRows(query, pgx.RowTo[string])
		require.NoError(t, err)
		require.Len(t, got, len(batches[0])+len(batches[1]))
		return got
	}
	requireSame := func(t *testing.T, want [][]outbox.Result, got [][]outbox.SubmitManyResult) {
		t.Helper()
		for b, batch := range batches {
			require.Len(t, got[b], len(batch))
			for i := range batch {
				require.NoError(t, got[b][i].Err)
				require.Equal(t, want[b][i], got[b][i].Result, "batch %d, call %d", b, i)
			}
		}
	}
	modes := []pgx.QueryExecMode{
		pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec,
		pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol,
	}
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			config, err := pgxpool.ParseConfig(pgoncetest.DatabaseURL(t))
			require.NoError(t, err)
			config.ConnConfig.DefaultQueryExecMode = mode
			config.MaxConns = 2
			pool, err := pgxpool.NewWithConfig(t.Context(), config)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			db := stdlib.OpenDBFromPool(pool)
			t.Cleanup(func() { _ = db.Close() })
			newConfig := func(t *testing.T) outbox.Config {
				t.Helper()
				return outbox.Config{Schema: pgoncetest.Schema(t), Registry: registry, NowFunc: func() time.Time { return now }}
			}

			t.Run("Pgx", func(t *testing.T) {
				oneConfig, manyConfig := newConfig(t), newConfig(t)
				one, err := outbox.NewPgx(pool, oneConfig)
				require.NoError(t, err)
				many, err := outbox.NewPgx(pool, manyConfig)
				require.NoError(t, err)
				want := make([][]outbox.Result, len(batches))
				got := make([][]outbox.SubmitManyResult, len(batches))
				for b, batch := range batches {
					require.NoError(t, pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
						for _, call := range batch {
							res, err := one.SubmitTx(t.Context(), tx, call)
							require.NoError(t, err)
							want[b] = append(want[b], res)
						}
						return nil
					}))
					require.NoError(t, pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
						got[b], err = many.SubmitManyTx(t.Context(), tx, batch)
						return err
					}))
				}
				requireSame(t, want, got)
				require.Equal(t, rows(t, oneConfig.Schema), rows(t, manyConfig.Schema))
			})

			t.Run("DatabaseSQL", func(t *testing.T) {
				oneConfig, manyConfig := newConfig(t), newConfig(t)
				one, err := outbox.New(db, oneConfig)
				require.NoError(t, err)
				many, err := outbox.New(db, manyConfig)
				require.NoError(t, err)
				want := make([][]outbox.Result, len(batches))
				got := make([][]outbox.SubmitManyResult, len(batches))
				for b, batch := range batches {
					tx, err := db.BeginTx(t.Context(), nil)
					require.NoError(t, err)
					for _, call := range batch {
						res, err := one.SubmitTx(t.Context(), tx, call)
						require.NoError(t, err)
						want[b] = append(want[b], res)
					}
					require.NoError(t, tx.Commit())
					tx, err = db.BeginTx(t.Context(), nil)
					require.NoError(t, err)
					got[b], err = many.SubmitManyTx(t.Context(), tx, batch)
					require.NoError(t, err)
					require.NoError(t, tx.Commit())
				}
				requireSame(t, want, got)
				require.Equal(t, rows(t, oneConfig.Schema), rows(t, manyConfig.Schema))
			})
		})
	}
}
