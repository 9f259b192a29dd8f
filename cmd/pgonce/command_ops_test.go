package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

func TestList(t *testing.T) {
	t.Parallel()

	t.Run("ByStateAndToolInTextAndJSON", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		review := f.needsReview(t)
		pending := f.pending(t, "refund")
		f.succeeded(t, "refund", `{}`)

		res := pgonce(t, "--schema", f.schema, "list", "--state", "needs_review", "--tool", "email")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Contains(t, res.stdout, "KEY")
		require.Contains(t, res.stdout, string(review))
		require.NotContains(t, res.stdout, string(pending))

		res = pgonce(t, "--schema", f.schema, "list", "--json")
		require.Equal(t, exitOK, res.code, res.stderr)
		doc := decodeJSON(t, res.stdout)
		keys, ok := doc["keys"].([]any)
		require.True(t, ok, res.stdout)
		require.Len(t, keys, 2, "succeeded keys are not listed")
		require.NotContains(t, doc, "cursor")

		res = pgonce(t, "--schema", f.schema, "list", "--state", "needs_review", "--tool", "refund")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Contains(t, res.stdout, "no keys")
	})

	t.Run("PagesWithCursor", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		for range 3 {
			f.pending(t, "refund")
		}
		res := pgonce(t, "--schema", f.schema, "list", "--limit", "2", "--json")
		require.Equal(t, exitOK, res.code, res.stderr)
		doc := decodeJSON(t, res.stdout)
		require.Len(t, doc["keys"], 2)
		cursor, ok := doc["cursor"].(string)
		require.True(t, ok, res.stdout)
		res = pgonce(t, "--schema", f.schema, "list", "--limit", "2", "--cursor", cursor, "--json")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Len(t, decodeJSON(t, res.stdout)["keys"], 1)
	})

	t.Run("BadParamsAreUsageErrors", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		for _, args := range [][]string{
			{"--state", "succeeded"},
			{"--limit", "0"},
			{"--cursor", "nope"},
			{"--since", "yesterday"},
		} {
			res := pgonce(t, append([]string{"--schema", f.schema, "list"}, args...)...)
			require.Equal(t, exitUsage, res.code, "%v: %s", args, res.stderr)
		}
	})
}

func TestCancelAndRetry(t *testing.T) {
	t.Parallel()

	t.Run("CancelThenRetryAudited", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		key := f.pending(t, "refund")
		res := pgonce(t, "--schema", f.schema, "cancel", string(key), "--reason", "customer withdrew", "--by", "alice")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Contains(t, res.stdout, "the key is now cancelled")

		res = pgonce(t, "--schema", f.schema, "cancel", string(key), "--reason", "again", "--by", "alice")
		require.Equal(t, exitRefused, res.code, res.stderr)
		require.Contains(t, res.stderr, "cancelled, not pending")

		res = pgonce(t, "--schema", f.schema, "retry", string(key), "--reason", "asked again", "--by", "bob", "--json")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Equal(t, "pending", decodeJSON(t, res.stdout)["state"])

		res = pgonce(t, "--schema", f.schema, "inspect", string(key), "--json")
		require.Equal(t, exitOK, res.code, res.stderr)
		resolutions, ok := decodeJSON(t, res.stdout)["resolutions"].([]any)
		require.True(t, ok)
		require.Len(t, resolutions, 2)
	})

	t.Run("RefusalsAndUsage", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		done := f.succeeded(t, "refund", `{}`)
		res := pgonce(t, "--schema", f.schema, "retry", string(done), "--reason", "why not", "--by", "bob")
		require.Equal(t, exitRefused, res.code, res.stderr)
		res = pgonce(t, "--schema", f.schema, "cancel", string(done), "--reason", "too late", "--by", "bob")
		require.Equal(t, exitRefused, res.code, res.stderr)
		res = pgonce(t, "--schema", f.schema, "cancel", unknownKey, "--reason", "x", "--by", "bob")
		require.Equal(t, exitNotFound, res.code, res.stderr)
		res = pgonce(t, "--schema", f.schema, "cancel", string(done))
		require.Equal(t, exitUsage, res.code, res.stderr)
		require.Contains(t, res.stderr, "--reason is required")
	})
}

func TestInspectShowsMetadataAndStoredDelivery(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	call := f.call("email")
	call.Metadata = map[string]string{"request_id": "req-42"}
	res, err := f.client.Submit(t.Context(), call)
	require.NoError(t, err)
	out := pgonce(t, "--schema", f.schema, "inspect", string(res.Key), "--json")
	require.Equal(t, exitOK, out.code, out.stderr)
	doc := decodeJSON(t, out.stdout)
	require.Equal(t, map[string]any{"request_id": "req-42"}, doc["metadata"])
	require.Equal(t, "at_most_once", doc["delivery"])
	out = pgonce(t, "--schema", f.schema, "inspect", string(res.Key))
	require.Equal(t, exitOK, out.code, out.stderr)
	require.Contains(t, out.stdout, `{"request_id":"req-42"}`)
}

// TestReconcileKeyedUsesStoredKeyRetention: `reconcile --keyed` names a
// tool without its provider's key retention; the retention stored with the
// key at submit still sends a key past it to review, where requeueing it
// could make the provider act twice.
func TestReconcileKeyedUsesStoredKeyRetention(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	registry := outbox.NewRegistry()
	require.NoError(t, registry.RegisterWithOpts("charge", outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
		return nil, errors.New("never called")
	}), outbox.IdempotentByKey, &outbox.ToolOpts{KeyRetention: time.Hour}))
	service, err := outbox.NewPgx(pgoncetest.Pool(t), outbox.Config{Schema: f.schema, Registry: registry})
	require.NoError(t, err)
	f.client = service
	key := f.crashed(t, "charge") // first attempted two hours ago

	res := pgonce(t, "--schema", f.schema, "reconcile", "--once", "--keyed", "charge", "--json")
	require.Equal(t, exitOK, res.code, res.stderr)
	got, err := service.Get(t.Context(), key)
	require.NoError(t, err)
	require.Equal(t, outbox.StateNeedsReview, got.State, strings.TrimSpace(res.stdout))
}

func TestListFind(t *testing.T) {
	t.Parallel()

	t.Run("AnOrderIDInTextAndJSON", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		call := f.call("refund")
		call.Tenant, call.Args = "globex", map[string]any{"order": 7731, "customer": "cus_5521"}
		call.Metadata = map[string]string{"ticket": "OPS-4471"}
		res, err := f.client.Do(t.Context(), call, nil)
		require.NoError(t, err)
		f.succeeded(t, "refund", `{}`)

		out := pgonce(t, "--schema", f.schema, "list", "--find", "7731")
		require.Equal(t, exitOK, out.code, out.stderr)
		require.Contains(t, out.stdout, string(res.Key))
		require.Contains(t, out.stdout, "MATCHED")
		require.Regexp(t, `succeeded\s+refund\s+globex/cli-test`, out.stdout, "succeeded keys are found")
		require.Equal(t, 2, strings.Count(out.stdout, "\n"), "a head and one key: %s", out.stdout)

		out = pgonce(t, "--schema", f.schema, "list", "--find", "cus_5521", "--json")
		require.Equal(t, exitOK, out.code, out.stderr)
		doc := decodeJSON(t, out.stdout)
		keys, ok := doc["keys"].([]any)
		require.True(t, ok, out.stdout)
		require.Len(t, keys, 1)
		key, ok := keys[0].(map[string]any)
		require.True(t, ok)
		require.Equal(t, string(res.Key), key["key"])
		require.Equal(t, []any{"args"}, key["matched"])
		require.Contains(t, key["args_head"], `"order":7731`)

		for _, args := range [][]string{{"--find", "OPS-4471", "--json"}, {"--find", "OPS-4471", "--in", "metadata", "--json"}} {
			out = pgonce(t, append([]string{"--schema", f.schema, "list"}, args...)...)
			require.Equal(t, exitOK, out.code, out.stderr)
			keys, ok = decodeJSON(t, out.stdout)["keys"].([]any)
			require.True(t, ok, out.stdout)
			require.Len(t, keys, 1, "%v", args)
			key, ok = keys[0].(map[string]any)
			require.True(t, ok)
			require.Equal(t, string(res.Key), key["key"])
			require.Equal(t, []any{"metadata"}, key["matched"], "%v", args)
		}

		out = pgonce(t, "--schema", f.schema, "list", "--find", "cli-test", "--in", "run_id")
		require.Equal(t, exitOK, out.code, out.stderr)
		require.Contains(t, out.stdout, "run cli-test of tenant globex (1 keys seen)")
		require.Contains(t, out.stdout, "run cli-test without a tenant (1 keys seen)")
	})

	t.Run("BadParamsAreUsageErrors", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		for _, args := range [][]string{
			{"--find", "x", "--state", "failed"},
			{"--find", "x", "--in", "tool"},
			{"--find", " "},
			{"--in", "args"},
		} {
			res := pgonce(t, append([]string{"--schema", f.schema, "list"}, args...)...)
			require.Equal(t, exitUsage, res.code, "%v: %s", args, res.stderr)
		}
	})
}

func TestInspectShowsAttemptsAndTombstones(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	call := f.call("refund")
	_, err := f.client.Do(t.Context(), call, outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
		return nil, errors.New("503 from the provider")
	}))
	require.Error(t, err)
	res, err := f.client.Do(t.Context(), call, nil)
	require.NoError(t, err)

	out := pgonce(t, "--schema", f.schema, "inspect", string(res.Key))
	require.Equal(t, exitOK, out.code, out.stderr)
	require.Regexp(t, `#1\s+\S+\s+retry by \S+, ended \S+: 503 from the provider`, out.stdout)
	require.Regexp(t, `#2\s+\S+\s+succeeded by \S+, ended`, out.stdout)
	out = pgonce(t, "--schema", f.schema, "inspect", string(res.Key), "--json")
	require.Equal(t, exitOK, out.code, out.stderr)
	history, ok := decodeJSON(t, out.stdout)["attempt_history"].([]any)
	require.True(t, ok, out.stdout)
	require.Len(t, history, 2)

	f.exec(t, pgoncetest.TombstoneStatement(f.schema), pgoncetest.StoredKey(t, string(res.Key)), nil)
	out = pgonce(t, "--schema", f.schema, "inspect", string(res.Key))
	require.Equal(t, exitOK, out.code, out.stderr)
	require.Regexp(t, `finished\s+succeeded`, out.stdout)
	out = pgonce(t, "--schema", f.schema, "inspect", string(res.Key), "--json")
	require.Equal(t, exitOK, out.code, out.stderr)
	require.Equal(t, "succeeded", decodeJSON(t, out.stdout)["expired_from"])
}
