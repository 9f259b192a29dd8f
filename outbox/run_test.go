package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"strings"
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

func TestRun(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testRun[pgx.Tx], testRun[*sql.Tx])
}

func runSteps(steps []outbox.RunStep) map[int64]outbox.State {
	states := map[int64]outbox.State{}
	for _, s := range steps {
		states[s.Step] = s.State
	}
	return states
}

func testRun[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Run("EveryStepInOrderFinishedOnesIncluded", func(t *testing.T) {
		t.Parallel()
		b := opsSetup(t, driver)
		ctx := t.Context()
		step := func(n int64, tool string) outbox.Call {
			return outbox.Call{Tenant: "acme", RunID: "run-agent", Step: n, Tool: tool, Args: map[string]any{"n": n}}
		}
		done, err := b.client.Do(ctx, step(0, "refund"), outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
			return json.RawMessage(`{"refund":"re_0"}`), nil
		}))
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, done.State)
		b.provider.err = outbox.Permanent(errors.New("declined"))
		failed, err := b.client.Do(ctx, step(1, "refund"), nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateFailed, failed.State)
		b.provider.err = outbox.Ambiguous(errors.New("timeout after send"))
		review, _ := b.client.Do(ctx, step(2, "email"), nil)
		require.Equal(t, outbox.StateNeedsReview, review.State)
		b.provider.err = nil
		pending, err := b.client.Submit(ctx, step(3, "refund"))
		require.NoError(t, err)
		cancelled, err := b.client.Submit(ctx, step(4, "refund"))
		require.NoError(t, err)
		_, err = b.client.Cancel(ctx, cancelled.Key, cancelBy)
		require.NoError(t, err)
		// Steps 5 and 6 were never asked for. Step 7 succeeded and was
		// pruned: its tombstone remains.
		pruned, err := b.client.Do(ctx, step(7, "refund"), nil)
		require.NoError(t, err)
		_, err = pgoncetest.Pool(t).Exec(ctx, pgoncetest.TombstoneStatement(b.schema), pgoncetest.StoredKey(t, string(pruned.Key)), nil)
		require.NoError(t, err)
		inFlight, err := b.client.Submit(ctx, step(8, "refund"))
		require.NoError(t, err)
		pgoncetest.AbandonKeys(t, b.schema, -time.Minute, inFlight.Key)
		// 31 missing steps, under the gap that ends a run, then step 40;
		// then 32 missing steps, and step 73 is past the run's end.
		late, err := b.client.Do(ctx, step(40, "refund"), nil)
		require.NoError(t, err)
		afterGap, err := b.client.Submit(ctx, step(73, "refund"))
		require.NoError(t, err)
		// Neither another tenant's run of the same id, nor another run, nor
		// a business-key call belongs to the run.
		for _, other := range []outbox.Call{
			{RunID: "run-agent", Step: 5, Tool: "refund", Args: map[string]any{}},
			{Tenant: "acme", RunID: "run-other", Step: 6, Tool: "refund", Args: map[string]any{}},
			{Tenant: "acme", Key: "order-8842", Tool: "refund", Args: map[string]any{}},
		} {
			_, err := b.client.Submit(ctx, other)
			require.NoError(t, err)
		}

		res, err := b.client.RunSteps(ctx, outbox.RunParams{Tenant: "acme", RunID: "run-agent"})
		require.NoError(t, err)
		require.Zero(t, res.NextStep)
		var order []int64
		for _, s := range res.Steps {
			order = append(order, s.Step)
		}
		require.Equal(t, []int64{0, 1, 2, 3, 4, 7, 8, 40}, order, "in step order, the gaps skipped, nothing past 32 missing steps")
		require.Equal(t, map[int64]outbox.State{
			0: outbox.StateSucceeded, 1: outbox.StateFailed, 2: outbox.StateNeedsReview, 3: outbox.StatePending,
			4: outbox.StateCancelled, 7: outbox.StateExpired, 8: outbox.StateInFlight, 40: outbox.StateSucceeded,
		}, runSteps(res.Steps))
		for i, want := range []outbox.Key{done.Key, failed.Key, review.Key, pending.Key, cancelled.Key, pruned.Key, inFlight.Key, late.Key} {
			require.Equal(t, want, res.Steps[i].Key, "step %d", res.Steps[i].Step)
		}
		require.JSONEq(t, `{"refund":"re_0"}`, string(res.Steps[0].Response), "a succeeded step carries its response")
		require.Equal(t, "refund", res.Steps[0].Tool)
		require.Equal(t, "email", res.Steps[2].Tool)
		require.False(t, res.Steps[5].CompletedAt.IsZero(), "a tombstone keeps its completion time")

		rest, err := b.client.RunSteps(ctx, outbox.RunParams{Tenant: "acme", RunID: "run-agent", FromStep: 42})
		require.NoError(t, err)
		require.Len(t, rest.Steps, 1, "asked from within the gap, the run goes on")
		require.Equal(t, afterGap.Key, rest.Steps[0].Key)
		require.Equal(t, int64(73), rest.Steps[0].Step)

		untenanted, err := b.client.RunSteps(ctx, outbox.RunParams{RunID: "run-agent"})
		require.NoError(t, err)
		require.Equal(t, map[int64]outbox.State{5: outbox.StatePending}, runSteps(untenanted.Steps), "the tenantless run of the same id is another run")

		none, err := b.client.RunSteps(ctx, outbox.RunParams{Tenant: "acme", RunID: "run-never"})
		require.NoError(t, err)
		require.Empty(t, none.Steps)
		require.Zero(t, none.NextStep)
	})

	t.Run("PagesThroughALongRun", func(t *testing.T) {
		t.Parallel()
		b := opsSetup(t, driver)
		var calls []outbox.Call
		for n := range int64(150) {
			calls = append(calls, outbox.Call{RunID: "run-long", Step: n, Tool: "refund", Args: map[string]any{"n": n}})
		}
		keys := b.driver.SubmitKeys(t, b.client, calls)

		var seen []outbox.Key
		params := outbox.RunParams{RunID: "run-long", Limit: 40}
		for page := 0; ; page++ {
			require.Less(t, page, 10, "the run never ends")
			res, err := b.client.RunSteps(t.Context(), params)
			require.NoError(t, err)
			require.LessOrEqual(t, len(res.Steps), 40)
			for _, s := range res.Steps {
				require.Equal(t, int64(len(seen)), s.Step)
				seen = append(seen, s.Key)
			}
			if res.NextStep == 0 {
				break
			}
			params.FromStep = res.NextStep
		}
		require.Equal(t, keys, seen)
	})

	t.Run("RefusesBadParams", func(t *testing.T) {
		t.Parallel()
		b := opsSetup(t, driver)
		for name, params := range map[string]outbox.RunParams{
			"NoRunID":       {},
			"NegativeStep":  {RunID: "r", FromStep: -1},
			"LimitTooBig":   {RunID: "r", Limit: outbox.RunLimitMax + 1},
			"NegativeLimit": {RunID: "r", Limit: -1},
			"LongRunID":     {RunID: strings.Repeat("r", outbox.CallStringMaxBytes+1)},
			"NULInTenant":   {RunID: "r", Tenant: "a\x00b"},
			"InvalidUTF8":   {RunID: "r\xff"},
		} {
			_, err := b.client.RunSteps(t.Context(), params)
			require.ErrorIs(t, err, outbox.ErrInvalidParams, name)
		}
	})
}

// TestRunPlanAtOneMillionKeys gives the hundred keys of one run of a
// million-key table (millionKeys) the scopes of steps 0 to 99, as a submit
// would have derived them, and shows that Run returns all of them in step
// order, tombstones included, reading each on the scope's unique index and
// never the table, on both drivers, in the one-off and the generic plan.
func TestRunPlanAtOneMillionKeys(t *testing.T) {
	t.Parallel()
	schema := pgoncetest.Schema(t)
	// The test's context lasts until its parallel subtests end; no
	// deadline of its own, which a busy machine would overrun.
	ctx := t.Context()
	millionKeys(t, ctx, schema)
	// The scope frame of KEYSPEC.md, for tenant "" and run-5000.
	quoted := ident.Quote(schema)
	tag, err := pgoncetest.Pool(t).Exec(ctx, `
		UPDATE `+quoted+`.pgonce_key AS k SET
			step = CASE WHEN k.state <> 'expired' THEN s.n END,
			scope = sha256(
				int4send(15) || convert_to('pgonce/scope/v1', 'UTF8') || int4send(4) || convert_to('step', 'UTF8') ||
				int4send(0) || int4send(8) || convert_to('run-5000', 'UTF8') ||
				int4send(length(s.n::text)) || convert_to(s.n::text, 'UTF8'))
		FROM (SELECT i - 500000 AS n, sha256(int8send(i)) AS key FROM generate_series(500000, 500099) AS i) AS s
		WHERE k.key = s.key`)
	require.NoError(t, err)
	require.Equal(t, int64(100), tag.RowsAffected())
	want := map[int64]outbox.State{}
	rows, err := pgoncetest.Pool(t).Query(ctx, `
		SELECT i - 500000, CASE WHEN k.state = 'open' AND k.lease_until IS NOT NULL THEN 'in_flight'
			WHEN k.state = 'open' THEN 'pending' ELSE k.state::text END
		FROM generate_series(500000, 500099) AS i JOIN `+quoted+`.pgonce_key AS k ON k.key = sha256(int8send(i))`)
	require.NoError(t, err)
	for rows.Next() {
		var n int64
		var state string
		require.NoError(t, rows.Scan(&n, &state))
		want[n] = outbox.State(state)
	}
	require.NoError(t, rows.Err())
	require.Len(t, want, 100)

	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("refund", &recordingProvider{}, outbox.IdempotentByKey))
	// The subtests run in contexts of their own: the setup's may have run
	// out while they waited for a parallel slot on a busy machine.
	check := func(t *testing.T, traced *pgxpool.Pool, tracer *statsTracer, runFunc func(outbox.RunParams) (outbox.RunResult, error)) {
		t.Helper()
		ctx := t.Context()
		res, err := runFunc(outbox.RunParams{RunID: "run-5000", Limit: outbox.RunLimitMax})
		require.NoError(t, err)
		require.Zero(t, res.NextStep)
		require.Len(t, res.Steps, 100)
		for i, s := range res.Steps {
			require.Equal(t, int64(i), s.Step)
		}
		require.Equal(t, want, runSteps(res.Steps))

		ran := tracer.reset()
		statement, ok := ran["KeyGetByScopes"]
		require.True(t, ok, "Run reads by scope")
		oneOff, generic := explainBoth(t, ctx, traced, statement)
		for _, plan := range []struct{ kind, text string }{{"one-off plan", oneOff}, {"generic plan", generic}} {
			t.Logf("KeyGetByScopes (%s):\n%s", plan.kind, plan.text)
			require.NotContains(t, plan.text, "Seq Scan on pgonce_key", plan.kind)
			require.Contains(t, plan.text, "pgonce_key_scope_key", plan.kind)
		}
	}
	t.Run(drivertest.NamePgx, func(t *testing.T) {
		t.Parallel()
		traced, tracer := tracedPool(t, t.Context())
		client := drivertest.Pgx().ClientOver(t, traced, outbox.Config{Schema: schema, Registry: registry})
		check(t, traced, tracer, func(p outbox.RunParams) (outbox.RunResult, error) { return client.RunSteps(t.Context(), p) })
	})
	t.Run(drivertest.NameDatabaseSQL, func(t *testing.T) {
		t.Parallel()
		traced, tracer := tracedPool(t, t.Context())
		client := drivertest.DatabaseSQL().ClientOver(t, traced, outbox.Config{Schema: schema, Registry: registry})
		check(t, traced, tracer, func(p outbox.RunParams) (outbox.RunResult, error) { return client.RunSteps(t.Context(), p) })
	})
}
