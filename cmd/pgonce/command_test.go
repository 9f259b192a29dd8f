package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

const unknownKey = "k1_0000000000000000000000000000000000000000000000000000000000000000"

func TestUsage(t *testing.T) {
	t.Parallel()

	t.Run("HelpPrintsCommandsAndExitCodes", func(t *testing.T) {
		t.Parallel()
		for _, args := range [][]string{{"--help"}, {"help"}} {
			res := pgonce(t, args...)
			require.Equal(t, exitOK, res.code, res.stderr)
			require.Contains(t, res.stdout, "Commands:")
			require.Contains(t, res.stdout, "Exit codes:")
		}
	})

	t.Run("EveryCommandHasHelp", func(t *testing.T) {
		t.Parallel()
		for _, c := range commands() {
			for _, args := range [][]string{{c.name, "--help"}, {"help", c.name}} {
				res := pgonce(t, args...)
				require.Equal(t, exitOK, res.code, "%v: %s", args, res.stderr)
				require.Contains(t, res.stdout, "Usage: pgonce "+c.name)
				if !c.noDatabase {
					require.Contains(t, res.stdout, "-database-url", "global flags are listed too")
				}
				if c.noSchema {
					require.NotContains(t, res.stdout, "-schema", "only the flags the command uses are listed")
				} else {
					require.Contains(t, res.stdout, "-schema", "global flags are listed too")
				}
			}
		}
	})

	t.Run("NoCommandIsAUsageError", func(t *testing.T) {
		t.Parallel()
		res := pgonce(t)
		require.Equal(t, exitUsage, res.code)
		require.Contains(t, res.stderr, "Commands:")
	})

	t.Run("UnknownCommand", func(t *testing.T) {
		t.Parallel()
		res := pgonce(t, "frobnicate")
		require.Equal(t, exitUsage, res.code)
		require.Contains(t, res.stderr, `unknown command "frobnicate"`)
	})

	t.Run("UnknownFlag", func(t *testing.T) {
		t.Parallel()
		res := pgonce(t, "status", "--bogus")
		require.Equal(t, exitUsage, res.code)
		require.Contains(t, res.stderr, "flag provided but not defined: -bogus")
		require.Contains(t, res.stderr, "pgonce status --help")
	})

	t.Run("InvalidSchemaName", func(t *testing.T) {
		t.Parallel()
		res := pgonce(t, "--schema", "Robert'); DROP", "status")
		require.Equal(t, exitUsage, res.code)
		require.Contains(t, res.stderr, "--schema: invalid schema name")
	})
}

func TestConnection(t *testing.T) {
	t.Parallel()

	const nowhere = "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable"

	t.Run("UnreachableSaysWhatToDo", func(t *testing.T) {
		t.Parallel()
		res := pgonce(t, "--database-url", nowhere, "status")
		require.Equal(t, exitFailure, res.code)
		require.Contains(t, res.stderr, "cannot reach PostgreSQL at "+nowhere+" (from --database-url)")
		require.Contains(t, res.stderr, "PGONCE_DATABASE_URL")
	})

	t.Run("PasswordIsRedacted", func(t *testing.T) {
		t.Parallel()
		res := pgonce(t, "--database-url", "postgres://me:hunter2@127.0.0.1:1/db", "status")
		require.Equal(t, exitFailure, res.code)
		require.NotContains(t, res.stderr, "hunter2")
	})

	t.Run("FlagBeatsPgonceVariableBeatsDatabaseURL", func(t *testing.T) {
		t.Parallel()
		schema := pgoncetest.Schema(t)
		good := pgoncetest.DatabaseURL(t)
		res := pgonceEnv(t, []string{"PGONCE_DATABASE_URL=" + nowhere}, "--database-url", good, "--schema", schema, "status")
		require.Equal(t, exitOK, res.code, res.stderr)
		res = pgonceEnv(t, []string{"PGONCE_DATABASE_URL=" + good, "DATABASE_URL=" + nowhere}, "--schema", schema, "status")
		require.Equal(t, exitOK, res.code, res.stderr)
		res = pgonceEnv(t, []string{"DATABASE_URL=" + nowhere}, "--schema", schema, "status")
		require.Equal(t, exitFailure, res.code)
		require.Contains(t, res.stderr, "(from $DATABASE_URL)")
	})

	t.Run("GlobalFlagsAfterTheCommand", func(t *testing.T) {
		t.Parallel()
		schema := pgoncetest.Schema(t)
		res := pgonceEnv(t, nil, "status", "--schema", schema, "--database-url", pgoncetest.DatabaseURL(t), "--json")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Equal(t, schema, decodeJSON(t, res.stdout)["schema"])
	})

	t.Run("SchemaNotMigratedNamesTheFix", func(t *testing.T) {
		t.Parallel()
		schema := pgoncetest.NewSchemaName(t)
		for _, args := range [][]string{
			{"status"},
			{"inspect", unknownKey},
			{"prune"},
			{"reconcile", "--once"},
			{"resolve", unknownKey, "--retry", "--reason", "x", "--by", "ops"},
		} {
			res := pgonce(t, append([]string{"--schema", schema}, args...)...)
			require.Equal(t, exitFailure, res.code, "%v", args)
			require.Contains(t, res.stderr, "schema "+schema+" is not migrated: run `pgonce --schema "+schema+" migrate up`", "%v", args)
		}
	})
}

func TestMigrate(t *testing.T) {
	t.Parallel()

	t.Run("UpStatusDown", func(t *testing.T) {
		t.Parallel()
		schema := pgoncetest.NewSchemaName(t)
		t.Cleanup(func() { pgoncetest.DropSchema(t, schema) })

		res := pgonce(t, "--schema", schema, "migrate", "up")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Contains(t, res.stdout, "schema "+schema+" is migrated to version ")

		res = pgonce(t, "migrate", "status", "--schema", schema, "--json")
		require.Equal(t, exitOK, res.code, res.stderr)
		status := decodeJSON(t, res.stdout)
		migrations := status["migrations"].([]any)
		require.NotEmpty(t, migrations)
		for _, m := range migrations {
			require.Equal(t, true, m.(map[string]any)["applied"], m)
			require.True(t, strings.HasSuffix(m.(map[string]any)["file"].(string), ".sql"), m)
		}

		res = pgonce(t, "--schema", schema, "migrate", "status")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Regexp(t, `00001\s+applied`, res.stdout)

		res = pgonce(t, "--schema", schema, "status")
		require.Equal(t, exitOK, res.code, res.stderr)

		res = pgonce(t, "--schema", schema, "migrate", "down")
		require.Equal(t, exitUsage, res.code)
		require.Contains(t, res.stderr, "pass --yes")

		res = pgonce(t, "--schema", schema, "migrate", "down", "--yes")
		require.Equal(t, exitOK, res.code, res.stderr)

		res = pgonce(t, "--schema", schema, "status")
		require.Equal(t, exitFailure, res.code)
		require.Contains(t, res.stderr, "is not migrated")
	})

	t.Run("UnknownAction", func(t *testing.T) {
		t.Parallel()
		res := pgonce(t, "migrate", "sideways")
		require.Equal(t, exitUsage, res.code)
		require.Contains(t, res.stderr, `unknown migrate action "sideways"`)
		res = pgonce(t, "migrate")
		require.Equal(t, exitUsage, res.code)
	})
}

func TestStatus(t *testing.T) {
	t.Parallel()

	t.Run("EmptySchemaIsNotStuck", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		res := pgonce(t, "--schema", f.schema, "status", "--fail-on-stuck")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Contains(t, res.stdout, "no keys")
		require.Contains(t, res.stdout, "stuck:         no")
	})

	t.Run("CountsByToolAndState", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		f.succeeded(t, "refund", `{}`)
		f.succeeded(t, "refund", `{}`)
		f.needsReview(t)

		res := pgonce(t, "--schema", f.schema, "status", "--json")
		require.Equal(t, exitOK, res.code, res.stderr)
		status := decodeJSON(t, res.stdout)
		keys := status["keys"].(map[string]any)
		require.InDelta(t, 2, keys["refund"].(map[string]any)["succeeded"], 0)
		require.InDelta(t, 1, keys["email"].(map[string]any)["needs_review"], 0)
		require.InDelta(t, 1, status["needs_review"], 0)
		require.Equal(t, true, status["stuck"])

		res = pgonce(t, "--schema", f.schema, "status")
		require.Equal(t, exitOK, res.code, res.stderr, "stuck without --fail-on-stuck still exits 0")
		require.Regexp(t, `FAILED\s+CANCELLED\s+NEEDS_REVIEW\s+EXPIRED\s+TOTAL`, res.stdout)
		require.Regexp(t, `refund\s+0\s+0\s+2\s+0\s+0\s+0\s+0\s+2`, res.stdout)
		require.Contains(t, res.stdout, "1 key needs review")
	})

	t.Run("FailOnStuck", func(t *testing.T) {
		t.Parallel()
		for name, makeStuck := range map[string]func(t *testing.T, f *fixture){
			"ExpiredLease": func(t *testing.T, f *fixture) { f.crashed(t, "refund") },
			"NeedsReview":  func(t *testing.T, f *fixture) { f.needsReview(t) },
			"OldPending":   func(t *testing.T, f *fixture) { f.pending(t, "refund") },
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				f := newFixture(t)
				makeStuck(t, f)
				res := pgonce(t, "--schema", f.schema, "status", "--fail-on-stuck")
				require.Equal(t, exitAttention, res.code, res.stderr)
				require.Contains(t, res.stdout, "stuck:         yes")
				require.Contains(t, res.stderr, "stuck: ")
			})
		}
	})

	t.Run("StuckAfter", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		f.pending(t, "refund") // waited an hour
		res := pgonce(t, "--schema", f.schema, "status", "--fail-on-stuck", "--stuck-after", "2h")
		require.Equal(t, exitOK, res.code, res.stderr)
		res = pgonce(t, "--schema", f.schema, "status", "--fail-on-stuck", "--stuck-after", "30m", "--json")
		require.Equal(t, exitAttention, res.code, res.stderr)
		require.Contains(t, res.stdout, "the oldest due pending key has waited")
		require.Contains(t, res.stdout, "is a dispatcher running for refund?")
		status := decodeJSON(t, res.stdout)
		oldest := status["oldest_pending_by_tool_ms"].(map[string]any)
		require.GreaterOrEqual(t, oldest["refund"], float64(3600000))
		require.Empty(t, status["estimated"], "a small table is counted exactly")
		res = pgonce(t, "--schema", f.schema, "status", "--stuck-after", "0s")
		require.Equal(t, exitUsage, res.code)
	})
}

func TestInspect(t *testing.T) {
	t.Parallel()

	// A response whose spacing, member order and HTML characters
	// encoding/json would change.
	const response = `{"z": 1,  "a": "<b>&</b>", "n": 1.50}`

	t.Run("PrintsTheResponseVerbatim", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		key := f.succeeded(t, "refund", response)

		res := pgonce(t, "--schema", f.schema, "inspect", string(key))
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Contains(t, res.stdout, "state         succeeded")
		require.Contains(t, res.stdout, "tool          refund")
		require.Contains(t, res.stdout, "\n"+response+"\n")

		res = pgonce(t, "--schema", f.schema, "inspect", string(key), "--json")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Contains(t, res.stdout, `"response":`+response)
		doc := decodeJSON(t, res.stdout)
		require.Equal(t, string(key), doc["key"])
		require.Equal(t, "succeeded", doc["state"])
		require.Equal(t, map[string]any{"i": float64(f.seq)}, doc["args"])
		require.Nil(t, doc["queue"])
	})

	t.Run("ShowsTheQueueAndResolutions", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		key := f.crashed(t, "refund")
		res := pgonce(t, "--schema", f.schema, "inspect", "--json", string(key))
		require.Equal(t, exitOK, res.code, res.stderr)
		doc := decodeJSON(t, res.stdout)
		require.Equal(t, "in_flight", doc["state"])
		require.Equal(t, "crashed", doc["queue"].(map[string]any)["worker"])

		key = f.needsReview(t)
		res = pgonce(t, "--schema", f.schema, "resolve", string(key), "--retry", "--reason", "the mail log shows nothing", "--by", "ops")
		require.Equal(t, exitOK, res.code, res.stderr)
		res = pgonce(t, "--schema", f.schema, "inspect", string(key))
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Contains(t, res.stdout, "retry by ops: the mail log shows nothing")
	})

	t.Run("ExpiredKeyShowsItsTombstone", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		key := f.succeeded(t, "refund", response)
		f.exec(t, `UPDATE pgonce_key SET expires_at = now() - interval '1 second' WHERE key = $1`, pgoncetest.StoredKey(t, string(key)))
		require.Equal(t, exitOK, pgonce(t, "--schema", f.schema, "prune").code)
		res := pgonce(t, "--schema", f.schema, "inspect", string(key))
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Contains(t, res.stdout, "state         expired")
	})

	t.Run("UnknownKeyExits4", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		res := pgonce(t, "--schema", f.schema, "inspect", unknownKey)
		require.Equal(t, exitNotFound, res.code)
		require.Contains(t, res.stderr, "key not found: "+unknownKey)
	})

	t.Run("MalformedKeyIsAUsageError", func(t *testing.T) {
		t.Parallel()
		res := pgonce(t, "inspect", "refund-8842")
		require.Equal(t, exitUsage, res.code)
		require.Contains(t, res.stderr, "invalid key")
		res = pgonce(t, "inspect")
		require.Equal(t, exitUsage, res.code)
	})
}

func TestResolve(t *testing.T) {
	t.Parallel()

	t.Run("Succeeded", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		key := f.needsReview(t)
		res := pgonce(t, "--schema", f.schema, "resolve", string(key),
			"--succeeded", "--response", `{"sent": true}`, "--reason", "the mail log shows delivery", "--by", "ops", "--json")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Equal(t, "succeeded", decodeJSON(t, res.stdout)["state"])
		got, err := f.client.Get(t.Context(), key)
		require.NoError(t, err)
		require.Equal(t, `{"sent": true}`, string(got.Response))

		res = pgonce(t, "--schema", f.schema, "resolve", string(key), "--retry", "--reason", "again", "--by", "ops")
		require.Equal(t, exitRefused, res.code)
		require.Contains(t, res.stderr, "is succeeded, not needs_review")
	})

	t.Run("FailedAndByDefaultsToUser", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		key := f.needsReview(t)
		res := pgonceEnv(t, []string{"PGONCE_DATABASE_URL=" + pgoncetest.DatabaseURL(t), "USER=alice"},
			"--schema", f.schema, "resolve", string(key), "--failed", "--failure", `{"error":"bounced"}`, "--reason", "bounced")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Contains(t, res.stdout, "failed by alice; the key is now failed")
		in, err := f.client.Inspect(t.Context(), key)
		require.NoError(t, err)
		require.Equal(t, "alice", in.Resolutions[0].By)
		require.Equal(t, outbox.StateFailed, in.State)
	})

	t.Run("UsageErrors", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		key := string(f.needsReview(t))
		for _, tt := range []struct {
			args []string
			want string
		}{
			{[]string{"--reason", "x"}, "exactly one of --succeeded, --failed, --retry"},
			{[]string{"--retry", "--succeeded", "--reason", "x"}, "exactly one of"},
			{[]string{"--succeeded", "--reason", "x"}, "--succeeded needs --response"},
			{[]string{"--failed", "--reason", "x"}, "--failed needs --failure"},
			{[]string{"--retry", "--response", "{}", "--reason", "x"}, "--retry takes no --response"},
			{[]string{"--succeeded", "--response", "{not json", "--reason", "x"}, "--response is not valid JSON"},
			{[]string{"--retry"}, "--reason is required"},
			{[]string{"--retry", "--reason", "x", "--by", ""}, "--by is required"},
		} {
			res := pgonce(t, append([]string{"--schema", f.schema, "resolve", key}, tt.args...)...)
			require.Equal(t, exitUsage, res.code, "%v: %s", tt.args, res.stderr)
			require.Contains(t, res.stderr, tt.want, "%v", tt.args)
		}
		got, err := f.client.Get(t.Context(), outbox.Key(key))
		require.NoError(t, err)
		require.Equal(t, outbox.StateNeedsReview, got.State, "usage errors change nothing")
	})

	t.Run("UnknownKeyExits4", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		res := pgonce(t, "--schema", f.schema, "resolve", unknownKey, "--retry", "--reason", "x", "--by", "ops")
		require.Equal(t, exitNotFound, res.code, res.stderr)
	})
}

func TestPrune(t *testing.T) {
	t.Parallel()

	f := newFixture(t)
	expired := f.succeeded(t, "refund", `{}`)
	kept := f.succeeded(t, "refund", `{}`)
	f.exec(t, `UPDATE pgonce_key SET expires_at = now() - interval '1 second' WHERE key = $1`, pgoncetest.StoredKey(t, string(expired)))

	res := pgonce(t, "--schema", f.schema, "prune", "--dry-run", "--json")
	require.Equal(t, exitOK, res.code, res.stderr)
	doc := decodeJSON(t, res.stdout)
	require.Equal(t, true, doc["dry_run"])
	require.InDelta(t, 1, doc["keys"], 0)
	_, err := f.client.Get(t.Context(), expired)
	require.NoError(t, err, "a dry run changes nothing")

	res = pgonce(t, "--schema", f.schema, "prune", "--batch-size", "1")
	require.Equal(t, exitOK, res.code, res.stderr)
	require.Contains(t, res.stdout, "turned 1 key into tombstones and deleted 0 tombstones")
	require.Empty(t, res.stderr, "no progress when stderr is not a terminal")
	_, err = f.client.Get(t.Context(), expired)
	require.ErrorIs(t, err, outbox.ErrExpired)
	_, err = f.client.Get(t.Context(), kept)
	require.NoError(t, err)

	res = pgonce(t, "--schema", f.schema, "prune", "--batch-size", "0")
	require.Equal(t, exitUsage, res.code)
}

func TestReconcile(t *testing.T) {
	t.Parallel()

	t.Run("ResolvesNamedToolsAndSkipsTheRest", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		refund := f.crashed(t, "refund")
		email := f.crashed(t, "email")
		provision := f.crashed(t, "provision")

		res := pgonce(t, "--schema", f.schema, "reconcile", "--once", "--keyed", "refund", "--at-most-once", "email", "--json")
		require.Equal(t, exitOK, res.code, res.stderr)
		doc := decodeJSON(t, res.stdout)
		require.Equal(t, map[string]any{"refund": 1.0, "email": 1.0}, doc["examined"])
		require.Equal(t, map[string]any{
			"refund": map[string]any{"requeued": 1.0},
			"email":  map[string]any{"needs_review": 1.0},
		}, doc["resolved"])
		require.Equal(t, map[string]any{"provision": 1.0}, doc["skipped_unregistered"])

		for key, want := range map[outbox.Key]outbox.State{
			refund: outbox.StatePending, email: outbox.StateNeedsReview, provision: outbox.StateInFlight,
		} {
			got, err := f.client.Get(t.Context(), key)
			require.NoError(t, err)
			require.Equal(t, want, got.State)
		}

		res = pgonce(t, "--schema", f.schema, "reconcile", "--once", "--fail-on-skipped")
		require.Equal(t, exitAttention, res.code, res.stderr)
		require.Regexp(t, `provision:\s+skipped 1 expired row `, res.stdout)
		require.Contains(t, res.stderr, "1 expired row skipped")
	})

	t.Run("TextReport", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		f.crashed(t, "refund")
		f.crashed(t, "refund")
		res := pgonce(t, "--schema", f.schema, "reconcile", "--once", "--keyed", "refund, other")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Regexp(t, `refund:\s+examined 2: requeued 2`, res.stdout)
		require.Contains(t, res.stdout, "stale pending: 0")
	})

	t.Run("FailOnStale", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		f.pending(t, "refund")
		res := pgonce(t, "--schema", f.schema, "reconcile", "--once", "--fail-on-stale")
		require.Equal(t, exitAttention, res.code, res.stderr)
		require.Contains(t, res.stdout, "stale pending: 1 row due")
		res = pgonce(t, "--schema", f.schema, "reconcile", "--once", "--fail-on-stale", "--stale-pending", "2h")
		require.Equal(t, exitOK, res.code, res.stderr)
	})

	t.Run("UsageErrors", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		for _, tt := range []struct {
			args []string
			want string
		}{
			{[]string{}, "pass --once"},
			{[]string{"--once", "--keyed", "Not A Tool"}, `--keyed: "Not A Tool" is not a tool name`},
			{[]string{"--once", "--keyed", "refund", "--at-most-once", "refund"}, `--at-most-once: tool "refund" is named twice`},
			{[]string{"--once", "--grace", "0s"}, "--grace must be positive"},
		} {
			res := pgonce(t, append([]string{"--schema", f.schema, "reconcile"}, tt.args...)...)
			require.Equal(t, exitUsage, res.code, "%v: %s", tt.args, res.stderr)
			require.Contains(t, res.stderr, tt.want, "%v", tt.args)
		}
	})
}
