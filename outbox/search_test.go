package outbox_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"encoding/hex"
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

func TestSearch(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testSearch[pgx.Tx], testSearch[*sql.Tx])
}

func testSearch[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	type testBundle struct {
		client *outbox.Client[TTx]
		schema string
	}
	setup := func(t *testing.T) *testBundle {
		t.Helper()
		schema := pgoncetest.Schema(t)
		registry := outbox.NewRegistry()
		ok := outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
			return json.RawMessage(`{"id":"re_1"}`), nil
		})
		require.NoError(t, registry.Register("refund", ok, outbox.IdempotentByKey))
		require.NoError(t, registry.Register("email", ok, outbox.AtMostOnce))
		return &testBundle{client: driver.Client(t, outbox.Config{Schema: schema, Registry: registry}), schema: schema}
	}
	do := func(t *testing.T, b *testBundle, call outbox.Call) outbox.Result {
		t.Helper()
		res, err := b.client.Do(t.Context(), call, nil)
		require.NoError(t, err)
		return res
	}
	keysOf := func(found []outbox.FoundKey) []outbox.Key {
		keys := []outbox.Key{}
		for _, k := range found {
			keys = append(keys, k.Key)
		}
		return keys
	}
	// age moves key's creation back by d, out of a recent window.
	age := func(t *testing.T, b *testBundle, key outbox.Key, d time.Duration) {
		t.Helper()
		_, err := pgoncetest.Pool(t).Exec(t.Context(), `UPDATE `+ident.Quote(b.schema)+`.pgonce_key
			SET created_at = created_at - $2::interval WHERE key = $1`, pgoncetest.StoredKey(t, string(key)), d.String())
		require.NoError(t, err)
	}

	t.Run("ByValueInTheArguments", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		refund := do(t, b, outbox.Call{RunID: "run-1", Step: 1, Tool: "refund", Args: map[string]any{"order": 8842, "amount": "42.00"}})
		named := do(t, b, outbox.Call{RunID: "run-1", Step: 2, Tool: "refund", Args: map[string]any{"order": "ord_8842"}})
		other := do(t, b, outbox.Call{RunID: "run-1", Step: 3, Tool: "refund", Args: map[string]any{"order": 7001, "note": "say \"hi\""}})

		res, err := b.client.Search(t.Context(), outbox.SearchParams{Text: "8842"})
		require.NoError(t, err)
		require.Equal(t, []outbox.Key{named.Key, refund.Key}, keysOf(res.Keys), "newest first, numbers and strings alike")
		require.Equal(t, []outbox.SearchField{outbox.SearchArgs}, res.Keys[0].Matched)
		require.Equal(t, outbox.StateSucceeded, res.Keys[1].State, "succeeded keys are found too")
		require.JSONEq(t, `{"amount":"42.00","order":8842}`, string(res.Keys[1].Args))

		res, err = b.client.Search(t.Context(), outbox.SearchParams{Text: `"ord_8842"`})
		require.NoError(t, err)
		require.Equal(t, []outbox.Key{named.Key}, keysOf(res.Keys), "a quoted string matches a whole string")

		res, err = b.client.Search(t.Context(), outbox.SearchParams{Text: `say "hi"`, Fields: []outbox.SearchField{outbox.SearchArgs}})
		require.NoError(t, err)
		require.Equal(t, []outbox.Key{other.Key}, keysOf(res.Keys), "text is matched as JSON escapes it")

		// Out of the window, a succeeded key is not read; a failed one
		// still is, as a listed key.
		age(t, b, refund.Key, 48*time.Hour)
		res, err = b.client.Search(t.Context(), outbox.SearchParams{Text: "8842"})
		require.NoError(t, err)
		require.Equal(t, []outbox.Key{named.Key}, keysOf(res.Keys))
		res, err = b.client.Search(t.Context(), outbox.SearchParams{Text: "8842", CreatedAfter: time.Now().Add(-72 * time.Hour)})
		require.NoError(t, err)
		require.Equal(t, []outbox.Key{named.Key, refund.Key}, keysOf(res.Keys), "a wider window")
	})

	t.Run("ByValueInTheMetadata", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ticket := do(t, b, outbox.Call{
			RunID: "run-1", Step: 1, Tool: "refund", Args: map[string]any{"order": 1},
			Metadata: map[string]string{"ticket": "OPS-4471", "note": "<b>refund</b> & more"},
		})
		order := do(t, b, outbox.Call{
			RunID: "run-1", Step: 2, Tool: "refund", Args: map[string]any{"order": 2},
			Metadata: map[string]string{"order": "ord_4471", "share": "100%", "who": `ana "the ops"`},
		})
		near := do(t, b, outbox.Call{
			RunID: "run-1", Step: 3, Tool: "refund", Args: map[string]any{"order": 3},
			Metadata: map[string]string{"share": "1000", "ticket": "OPS_4471x"},
		})
		do(t, b, outbox.Call{RunID: "run-1", Step: 4, Tool: "refund", Args: map[string]any{"order": 4}})

		search := func(t *testing.T, text string, fields ...outbox.SearchField) outbox.SearchResult {
			t.Helper()
			res, err := b.client.Search(t.Context(), outbox.SearchParams{Text: text, Fields: fields})
			require.NoError(t, err)
			return res
		}
		res := search(t, "4471")
		require.Equal(t, []outbox.Key{near.Key, order.Key, ticket.Key}, keysOf(res.Keys), "newest first")
		require.Equal(t, []outbox.SearchField{outbox.SearchMetadata}, res.Keys[0].Matched)
		res = search(t, "OPS-4471", outbox.SearchMetadata)
		require.Equal(t, []outbox.Key{ticket.Key}, keysOf(res.Keys))
		require.Equal(t, []outbox.SearchField{outbox.SearchMetadata}, res.Keys[0].Matched)
		require.Empty(t, search(t, "OPS-4471", outbox.SearchArgs).Keys, "the arguments do not hold it")

		// Literal: no character is a wildcard, and text is matched as
		// encoding/json writes the metadata, HTML escapes included.
		require.Equal(t, []outbox.Key{order.Key}, keysOf(search(t, "100%", outbox.SearchMetadata).Keys))
		require.Equal(t, []outbox.Key{near.Key}, keysOf(search(t, "OPS_4471", outbox.SearchMetadata).Keys), "_ is no wildcard")
		require.Empty(t, search(t, "1%0", outbox.SearchMetadata).Keys, "% is no wildcard")
		require.Equal(t, []outbox.Key{ticket.Key}, keysOf(search(t, "<b>refund</b> & more", outbox.SearchMetadata).Keys))
		require.Equal(t, []outbox.Key{order.Key}, keysOf(search(t, `ana "the ops"`, outbox.SearchMetadata).Keys))
		require.Equal(t, []outbox.Key{ticket.Key}, keysOf(search(t, `"OPS-4471"`, outbox.SearchMetadata).Keys), "a quoted string matches a whole string")
		require.Empty(t, search(t, `"OPS-447"`, outbox.SearchMetadata).Keys)

		// Out of the window, a succeeded key is not read.
		age(t, b, ticket.Key, 48*time.Hour)
		require.Empty(t, search(t, "OPS-4471").Keys)
		res, err := b.client.Search(t.Context(), outbox.SearchParams{Text: "OPS-4471", CreatedAfter: time.Now().Add(-72 * time.Hour)})
		require.NoError(t, err)
		require.Equal(t, []outbox.Key{ticket.Key}, keysOf(res.Keys), "a wider window")
	})

	t.Run("OlderListedKeysAreSearchedByMetadataWhateverTheWindow", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		res, err := b.client.Submit(t.Context(), outbox.Call{
			RunID: "run-1", Step: 1, Tool: "refund", Args: map[string]any{"order": 1},
			Metadata: map[string]string{"ticket": "OPS-4471"},
		})
		require.NoError(t, err)
		age(t, b, res.Key, 30*24*time.Hour)
		found, err := b.client.Search(t.Context(), outbox.SearchParams{Text: "OPS-4471"})
		require.NoError(t, err)
		require.Equal(t, []outbox.Key{res.Key}, keysOf(found.Keys))
		require.Equal(t, outbox.StatePending, found.Keys[0].State)
		require.Equal(t, []outbox.SearchField{outbox.SearchMetadata}, found.Keys[0].Matched)
	})

	t.Run("OlderListedKeysAreSearchedWhateverTheWindow", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		res, err := b.client.Submit(t.Context(), outbox.Call{RunID: "run-1", Step: 1, Tool: "refund", Args: map[string]any{"order": 8842}})
		require.NoError(t, err)
		age(t, b, res.Key, 30*24*time.Hour)
		found, err := b.client.Search(t.Context(), outbox.SearchParams{Text: "8842"})
		require.NoError(t, err)
		require.Equal(t, []outbox.Key{res.Key}, keysOf(found.Keys))
		require.Equal(t, outbox.StatePending, found.Keys[0].State)
	})

	t.Run("ByNaturalIDAtAnyAge", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		sent := do(t, b, outbox.Call{Tenant: "globex", RunID: "run-1", Step: 1, Tool: "email", NaturalID: "mail-8842", Args: map[string]any{"to": "ana"}})
		age(t, b, sent.Key, 90*24*time.Hour)
		res, err := b.client.Search(t.Context(), outbox.SearchParams{Text: "mail-8842"})
		require.NoError(t, err)
		require.Equal(t, []outbox.Key{sent.Key}, keysOf(res.Keys))
		require.Equal(t, "mail-8842", res.Keys[0].NaturalID)
		require.Equal(t, "globex", res.Keys[0].Tenant)
		require.Equal(t, []outbox.SearchField{outbox.SearchNaturalID}, res.Keys[0].Matched)

		res, err = b.client.Search(t.Context(), outbox.SearchParams{Text: "mail-8842", Tenant: "initech"})
		require.NoError(t, err)
		require.Empty(t, res.Keys, "another tenant's")
	})

	t.Run("ByBusinessKeyThroughItsScopeOrAmongRecentKeys", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		refund := do(t, b, outbox.Call{Tenant: "globex", Key: "refund-order-8842", Tool: "refund", Args: map[string]any{"order": 8842}})
		age(t, b, refund.Key, 90*24*time.Hour)
		res, err := b.client.Search(t.Context(), outbox.SearchParams{Text: "refund-order-8842", Tenant: "globex"})
		require.NoError(t, err)
		require.Equal(t, []outbox.Key{refund.Key}, keysOf(res.Keys), "through the scope, at any age")
		require.Equal(t, []outbox.SearchField{outbox.SearchBusinessKey}, res.Keys[0].Matched)
		require.Equal(t, "refund-order-8842", res.Keys[0].BusinessKey)
		require.Nil(t, res.Keys[0].Response, "a search returns no stored outcome")

		res, err = b.client.Search(t.Context(), outbox.SearchParams{Text: "refund-order-8842"})
		require.NoError(t, err)
		require.Empty(t, res.Keys, "without its tenant, an old business key is out of reach")

		recent := do(t, b, outbox.Call{Tenant: "initech", Key: "refund-order-9001", Tool: "refund", Args: map[string]any{"order": 9001}})
		res, err = b.client.Search(t.Context(), outbox.SearchParams{Text: "refund-order-9001"})
		require.NoError(t, err)
		require.Equal(t, []outbox.Key{recent.Key}, keysOf(res.Keys), "a recent one, under any tenant")
	})

	t.Run("ByKeyOrKeyPrefix", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		res := do(t, b, outbox.Call{RunID: "run-1", Step: 1, Tool: "refund", Args: map[string]any{"order": 1}})
		_, err := pgoncetest.Pool(t).Exec(t.Context(), pgoncetest.TombstoneStatement(b.schema), pgoncetest.StoredKey(t, string(res.Key)), nil)
		require.NoError(t, err)
		found, err := b.client.Search(t.Context(), outbox.SearchParams{Text: string(res.Key)})
		require.NoError(t, err)
		require.Equal(t, []outbox.Key{res.Key}, keysOf(found.Keys), "a whole key, a tombstone's too")
		require.Equal(t, outbox.StateExpired, found.Keys[0].State)

		live := do(t, b, outbox.Call{RunID: "run-1", Step: 2, Tool: "refund", Args: map[string]any{"order": 2}})
		for _, prefix := range []string{string(live.Key)[:12], string(live.Key)[3:12], strings.ToUpper(string(live.Key)[3:12])} {
			found, err = b.client.Search(t.Context(), outbox.SearchParams{Text: prefix})
			require.NoError(t, err)
			require.Equal(t, []outbox.Key{live.Key}, keysOf(found.Keys), prefix)
			require.Equal(t, []outbox.SearchField{outbox.SearchKey}, found.Keys[0].Matched)
		}
	})

	t.Run("ARunWithoutItsTenant", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for step := range int64(3) {
			do(t, b, outbox.Call{Tenant: "globex", RunID: "run-7", Step: step, Tool: "refund", Args: map[string]any{"n": step}})
		}
		do(t, b, outbox.Call{RunID: "run-7", Step: 0, Tool: "refund", Args: map[string]any{"n": 0}})
		res, err := b.client.Search(t.Context(), outbox.SearchParams{Text: "run-7", Fields: []outbox.SearchField{outbox.SearchRunID}})
		require.NoError(t, err)
		require.Equal(t, []outbox.FoundRun{{Tenant: "", RunID: "run-7", Keys: 1}, {Tenant: "globex", RunID: "run-7", Keys: 3}}, res.Runs)
		require.Empty(t, res.Keys, "a run's keys are read on its page")

		// Out of the window, a run is still found under the tenant given,
		// by its steps.
		_, err = pgoncetest.Pool(t).Exec(t.Context(), `UPDATE `+ident.Quote(b.schema)+`.pgonce_key SET created_at = created_at - interval '10 days'`)
		require.NoError(t, err)
		res, err = b.client.Search(t.Context(), outbox.SearchParams{Text: "run-7", Tenant: "globex"})
		require.NoError(t, err)
		require.Equal(t, []outbox.FoundRun{{Tenant: "globex", RunID: "run-7"}}, res.Runs)
		res, err = b.client.Search(t.Context(), outbox.SearchParams{Text: "run-7"})
		require.NoError(t, err)
		require.Equal(t, []outbox.FoundRun{{Tenant: "", RunID: "run-7"}}, res.Runs, "the run without a tenant, by its steps")
	})

	t.Run("LimitAndMore", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for step := range int64(3) {
			do(t, b, outbox.Call{RunID: "run-1", Step: step, Tool: "refund", Args: map[string]any{"customer": "cus_77"}})
		}
		res, err := b.client.Search(t.Context(), outbox.SearchParams{Text: "cus_77", Limit: 2})
		require.NoError(t, err)
		require.Len(t, res.Keys, 2)
		require.True(t, res.More)
		res, err = b.client.Search(t.Context(), outbox.SearchParams{Text: "cus_77", Limit: 3})
		require.NoError(t, err)
		require.Len(t, res.Keys, 3)
		require.False(t, res.More)
	})

	t.Run("BadParamsChangeNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, params := range []outbox.SearchParams{
			{},
			{Text: " "},
			{Text: "a\x00b"},
			{Text: "\xff"},
			{Text: strings.Repeat("x", outbox.CallStringMaxBytes+1)},
			{Text: "x", Tenant: "\xff"},
			{Text: "x", Limit: -1},
			{Text: "x", Limit: outbox.SearchLimitMax + 1},
			{Text: "x", Fields: []outbox.SearchField{"tool"}},
			{Text: "x", CreatedAfter: time.Now(), CreatedBefore: time.Now().Add(-time.Hour)},
		} {
			_, err := b.client.Search(t.Context(), params)
			require.ErrorIs(t, err, outbox.ErrInvalidParams, "%+v", params)
		}
	})
}

func TestListWindow(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testListWindow[pgx.Tx], testListWindow[*sql.Tx])
}

func testListWindow[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	setup := func(t *testing.T) (*outbox.Client[TTx], string) {
		t.Helper()
		schema := pgoncetest.Schema(t)
		registry := outbox.NewRegistry()
		calls := 0
		require.NoError(t, registry.Register("refund", outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
			calls++
			if calls%2 == 0 {
				return nil, outbox.Permanent(errors.New("declined"))
			}
			return json.RawMessage(`{}`), nil
		}), outbox.IdempotentByKey))
		return driver.Client(t, outbox.Config{Schema: schema, Registry: registry}), schema
	}

	t.Run("SucceededKeysWithinAWindow", func(t *testing.T) {
		t.Parallel()
		client, schema := setup(t)
		var succeeded []outbox.Key
		for step := range int64(6) {
			res, err := client.Do(t.Context(), outbox.Call{RunID: "run-1", Step: step, Tool: "refund", Args: map[string]any{"order": step}}, nil)
			if res.State == outbox.StateSucceeded {
				require.NoError(t, err)
				succeeded = append(succeeded, res.Key)
			}
		}
		require.Len(t, succeeded, 3)
		old := succeeded[0]
		_, err := pgoncetest.Pool(t).Exec(t.Context(), `UPDATE `+ident.Quote(schema)+`.pgonce_key SET created_at = created_at - interval '2 days' WHERE key = $1`,
			pgoncetest.StoredKey(t, string(old)))
		require.NoError(t, err)

		params := outbox.ListParams{States: []outbox.State{outbox.StateSucceeded}, CreatedAfter: time.Now().Add(-time.Hour), Limit: 1}
		var listed []outbox.Key
		for {
			page, err := client.List(t.Context(), params)
			require.NoError(t, err)
			for _, k := range page.Keys {
				require.Equal(t, outbox.StateSucceeded, k.State)
				require.JSONEq(t, `{"order":`+string(rune('0'+k.Step))+`}`, string(k.Args))
				listed = append(listed, k.Key)
			}
			if page.Cursor == "" {
				break
			}
			params.Cursor = page.Cursor
		}
		require.Equal(t, succeeded[1:], listed, "the window's succeeded keys, oldest first, a page at a time")

		both, err := client.List(t.Context(), outbox.ListParams{
			States: []outbox.State{outbox.StateSucceeded, outbox.StateFailed}, CreatedAfter: time.Now().Add(-time.Hour),
		})
		require.NoError(t, err)
		require.Len(t, both.Keys, 5)
	})

	t.Run("NoWindowNoSucceededKeys", func(t *testing.T) {
		t.Parallel()
		client, _ := setup(t)
		for _, params := range []outbox.ListParams{
			{States: []outbox.State{outbox.StateSucceeded}},
			{States: []outbox.State{outbox.StateExpired}, CreatedAfter: time.Now().Add(-outbox.ListWindowMax - time.Hour)},
			{States: []outbox.State{outbox.StateSucceeded}, CreatedAfter: time.Now().Add(-72 * time.Hour), CreatedBefore: time.Now().Add(-time.Hour)},
		} {
			_, err := client.List(t.Context(), params)
			require.ErrorIs(t, err, outbox.ErrInvalidParams)
		}
	})

	t.Run("CountCreatedInAWindow", func(t *testing.T) {
		t.Parallel()
		client, schema := setup(t)
		for step := range int64(4) {
			_, _ = client.Do(t.Context(), outbox.Call{RunID: "run-1", Step: step, Tool: "refund", Args: map[string]any{"order": step}}, nil)
		}
		_, err := client.Submit(t.Context(), outbox.Call{RunID: "run-1", Step: 9, Tool: "refund", Args: map[string]any{}})
		require.NoError(t, err)
		_, err = pgoncetest.Pool(t).Exec(t.Context(), `UPDATE `+ident.Quote(schema)+`.pgonce_key SET created_at = created_at - interval '2 hours' WHERE step < 2`)
		require.NoError(t, err)

		counts, err := client.CountCreated(t.Context(), outbox.CountCreatedParams{CreatedAfter: time.Now().Add(-time.Hour)})
		require.NoError(t, err)
		require.Equal(t, map[string]map[outbox.State]int64{"refund": {outbox.StateSucceeded: 1, outbox.StateFailed: 1, outbox.StatePending: 1}}, counts.Keys)
		require.False(t, counts.Partial)
		counts, err = client.CountCreated(t.Context(), outbox.CountCreatedParams{CreatedAfter: time.Now().Add(-24 * time.Hour)})
		require.NoError(t, err)
		require.Equal(t, map[string]map[outbox.State]int64{"refund": {outbox.StateSucceeded: 2, outbox.StateFailed: 2, outbox.StatePending: 1}}, counts.Keys)

		_, err = client.CountCreated(t.Context(), outbox.CountCreatedParams{})
		require.ErrorIs(t, err, outbox.ErrInvalidParams)
	})
}

// TestSearchPlanAtOneMillionKeys builds a key table of a million keys by
// SQL, one created a second over 11.6 days (see fillKeys), gives three of
// them a ticket in their metadata (one of the last day, one older and
// pending, one older and succeeded), and shows that a search of the
// metadata finds the first two without reading the table whole, on both
// drivers: the statement reads the last day through the BRIN index on
// created_at and the older keys through pgonce_key_list_idx, with no
// sequential scan of pgonce_key in the plan a one-off statement gets nor in
// the generic plan a cached prepared statement may switch to.
func TestSearchPlanAtOneMillionKeys(t *testing.T) {
	t.Parallel()
	schema := pgoncetest.Schema(t)
	// The test's context lasts until its parallel subtests end; no
	// deadline of its own, which a busy machine would overrun.
	ctx := t.Context()
	const n = 1000000
	fillKeys(t, ctx, schema, n)
	// keyOf is the key fillKeys gives its i-th row.
	keyOf := func(i int64) outbox.Key {
		sum := sha256.Sum256(binary.BigEndian.AppendUint64(nil, uint64(i))) //nolint:gosec // a positive row number
		return outbox.Key(outbox.KeyPrefix + hex.EncodeToString(sum[:]))
	}
	recent, olderPending, olderSucceeded := int64(n-10), int64(n/2+2), int64(n/2+300)
	for _, i := range []int64{recent, olderPending, olderSucceeded} {
		tag, err := pgoncetest.Pool(t).Exec(ctx, `UPDATE `+ident.Quote(schema)+`.pgonce_key
			SET metadata = convert_to('{"ticket":"OPS-4471"}', 'UTF8') WHERE key = sha256(int8send($1::bigint))`, i)
		require.NoError(t, err)
		require.Equal(t, int64(1), tag.RowsAffected())
	}
	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("refund", &recordingProvider{}, outbox.IdempotentByKey))

	check := func(t *testing.T, traced *pgxpool.Pool, tracer *statsTracer, searchFunc func(outbox.SearchParams) (outbox.SearchResult, error)) {
		t.Helper()
		for _, fields := range [][]outbox.SearchField{{outbox.SearchMetadata}, nil} {
			tracer.reset()
			res, err := searchFunc(outbox.SearchParams{Text: "OPS-4471", Fields: fields})
			require.NoError(t, err)
			ran := tracer.reset()
			require.Len(t, res.Keys, 2, "the key of the last day and the older pending one, not the older succeeded one")
			require.Equal(t, keyOf(recent), res.Keys[0].Key)
			require.Equal(t, keyOf(olderPending), res.Keys[1].Key)
			for _, key := range res.Keys {
				require.Equal(t, []outbox.SearchField{outbox.SearchMetadata}, key.Matched)
			}
			statement, ok := ran["KeySearch"]
			require.True(t, ok, "the search ran KeySearch")
			oneOff, generic := explainBoth(t, ctx, traced, statement)
			for _, plan := range []struct{ kind, text string }{{"one-off plan", oneOff}, {"generic plan", generic}} {
				t.Logf("KeySearch, fields %v (%s):\n%s", fields, plan.kind, plan.text)
				require.NotContains(t, plan.text, "Seq Scan on pgonce_key", plan.kind)
				require.Contains(t, plan.text, "pgonce_key_created_at_idx", plan.kind)
				require.Contains(t, plan.text, "pgonce_key_list_idx", plan.kind)
			}
		}
	}
	t.Run(drivertest.NamePgx, func(t *testing.T) {
		t.Parallel()
		traced, tracer := tracedPool(t, ctx)
		client := drivertest.Pgx().ClientOver(t, traced, outbox.Config{Schema: schema, Registry: registry})
		check(t, traced, tracer, func(p outbox.SearchParams) (outbox.SearchResult, error) { return client.Search(ctx, p) })
	})
	t.Run(drivertest.NameDatabaseSQL, func(t *testing.T) {
		t.Parallel()
		traced, tracer := tracedPool(t, ctx)
		client := drivertest.DatabaseSQL().ClientOver(t, traced, outbox.Config{Schema: schema, Registry: registry})
		check(t, traced, tracer, func(p outbox.SearchParams) (outbox.SearchResult, error) { return client.Search(ctx, p) })
	})
}
