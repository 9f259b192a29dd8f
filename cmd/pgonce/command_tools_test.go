package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

func TestTools(t *testing.T) {
	t.Parallel()

	t.Run("PauseAndResumeAudited", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		res := pgonce(t, "--schema", f.schema, "tools")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Contains(t, res.stdout, "no tool in schema")

		res = pgonce(t, "--schema", f.schema, "pause", "refund", "--reason", "provider incident", "--by", "alice")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Contains(t, res.stdout, "paused refund by alice")

		// The CLI's pause is the library's: a database/sql client sees it.
		std, err := outbox.New(pgoncetest.DB(t), outbox.Config{Schema: f.schema})
		require.NoError(t, err)
		status, err := std.Tool(t.Context(), "refund")
		require.NoError(t, err)
		require.True(t, status.Paused)
		require.Equal(t, "alice", status.PausedBy)
		require.Equal(t, "provider incident", status.PausedReason)

		res = pgonce(t, "--schema", f.schema, "pause", "refund", "--reason", "again", "--by", "bob")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Contains(t, res.stdout, "paused already")
		require.Contains(t, res.stdout, "by alice: provider incident")

		res = pgonce(t, "--schema", f.schema, "tools")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Contains(t, res.stdout, "TOOL")
		require.Contains(t, res.stdout, "by alice: provider incident")

		res = pgonce(t, "--schema", f.schema, "tools", "--json")
		require.Equal(t, exitOK, res.code, res.stderr)
		tools, ok := decodeJSON(t, res.stdout)["tools"].([]any)
		require.True(t, ok, res.stdout)
		require.Len(t, tools, 1)
		tool, ok := tools[0].(map[string]any)
		require.True(t, ok)
		require.Equal(t, "refund", tool["tool"])
		require.Equal(t, true, tool["paused"])
		require.Equal(t, "alice", tool["paused_by"])
		require.Contains(t, tool, "paused_at")

		res = pgonce(t, "--schema", f.schema, "resume", "refund", "--by", "bob", "--json")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Equal(t, false, decodeJSON(t, res.stdout)["paused"])
		status, err = std.Tool(t.Context(), "refund")
		require.NoError(t, err)
		require.False(t, status.Paused)

		res = pgonce(t, "--schema", f.schema, "resume", "refund", "--by", "bob")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Contains(t, res.stdout, "not paused; nothing changed")

		res = pgonce(t, "--schema", f.schema, "tools", "refund", "--json")
		require.Equal(t, exitOK, res.code, res.stderr)
		actions, ok := decodeJSON(t, res.stdout)["actions"].([]any)
		require.True(t, ok, res.stdout)
		require.Len(t, actions, 2, "the second pause and resume record nothing")
		newest, ok := actions[0].(map[string]any)
		require.True(t, ok)
		require.Equal(t, "resume", newest["action"])
		require.Equal(t, "bob", newest["by"])

		res = pgonce(t, "--schema", f.schema, "tools", "refund")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Contains(t, res.stdout, "paused:        no")
		require.Contains(t, res.stdout, "pause")
		require.Contains(t, res.stdout, "provider incident")
	})

	t.Run("LimitSetsReplacesAndClears", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		res := pgonce(t, "--schema", f.schema, "limit", "refund", "--max-in-flight", "25", "--rate", "20", "--reason", "Stripe live-mode limit", "--by", "alice")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Contains(t, res.stdout, "limited refund to 25 in flight, 20 calls/s (burst 20) by alice")
		status, err := f.client.Tool(t.Context(), "refund")
		require.NoError(t, err)
		require.Equal(t, outbox.ToolLimits{MaxInFlight: 25, Rate: 20, Burst: 20}, status.Limits)

		res = pgonce(t, "--schema", f.schema, "limit", "refund", "--rate", "2.5", "--burst", "5", "--reason", "slower", "--by", "alice", "--json")
		require.Equal(t, exitOK, res.code, res.stderr)
		doc := decodeJSON(t, res.stdout)
		require.InDelta(t, 2.5, doc["rate"], 0)
		require.InDelta(t, 5, doc["burst"], 0)
		require.InDelta(t, 0, doc["max_in_flight"], 0, "the limits given replace the tool's")

		res = pgonce(t, "--schema", f.schema, "tools")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Regexp(t, `refund\s+-\s+2\.5\s+5\s+-\s+-`, res.stdout)

		res = pgonce(t, "--schema", f.schema, "limit", "refund", "--clear", "--reason", "batch API", "--by", "alice")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Contains(t, res.stdout, "cleared the limits of refund")
		statuses, err := f.client.Tools(t.Context())
		require.NoError(t, err)
		require.Empty(t, statuses, "a tool without limits, pause or slow-down has no flow control")
	})

	t.Run("BadInputIsAUsageErrorAndChangesNothing", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		for _, args := range [][]string{
			{"pause", "refund", "--by", "alice"},
			{"pause", "--reason", "x", "--by", "alice"},
			{"pause", "refund", "email", "--reason", "x", "--by", "alice"},
			{"pause", "refund", "--reason", "x", "--by", ""},
			{"pause", "", "--reason", "x", "--by", "alice"},
			{"pause", "re\xfffund", "--reason", "x", "--by", "alice"},
			{"pause", strings.Repeat("t", 2001), "--reason", "x", "--by", "alice"},
			{"resume"},
			{"limit", "refund", "--reason", "x", "--by", "alice"},
			{"limit", "refund", "--max-in-flight", "0", "--reason", "x", "--by", "alice"},
			{"limit", "refund", "--max-in-flight", "-3", "--reason", "x", "--by", "alice"},
			{"limit", "refund", "--max-in-flight", "many", "--reason", "x", "--by", "alice"},
			{"limit", "refund", "--rate", "0", "--reason", "x", "--by", "alice"},
			{"limit", "refund", "--rate", "NaN", "--reason", "x", "--by", "alice"},
			{"limit", "refund", "--rate", "1e9", "--reason", "x", "--by", "alice"},
			{"limit", "refund", "--burst", "5", "--max-in-flight", "3", "--reason", "x", "--by", "alice"},
			{"limit", "refund", "--rate", "5", "--burst", "0", "--reason", "x", "--by", "alice"},
			{"limit", "refund", "--clear", "--rate", "5", "--reason", "x", "--by", "alice"},
			{"limit", "refund", "--max-in-flight", "3", "--by", "alice"},
			{"tools", "refund", "email"},
			{"tools", "re\xfffund"},
			// Names no call can have: a typo must not look like it worked.
			{"pause", "Bad Tool!", "--reason", "x", "--by", "alice"},
			{"pause", "Refund", "--reason", "x", "--by", "alice"},
			{"pause", "a b", "--reason", "x", "--by", "alice"},
			{"pause", strings.Repeat("t", 65), "--reason", "x", "--by", "alice"},
			{"resume", "Refund", "--by", "alice"},
			{"limit", "Refund", "--max-in-flight", "3", "--reason", "x", "--by", "alice"},
			{"limit", "a b", "--clear", "--reason", "x", "--by", "alice"},
			{"tools", "Refund"},
		} {
			res := pgonce(t, append([]string{"--schema", f.schema}, args...)...)
			require.Equal(t, exitUsage, res.code, "%q: %s", args, res.stderr)
			require.NotEmpty(t, res.stderr, "%q", args)
			require.NotContains(t, res.stderr, "SQLSTATE", "%q", args)
		}
		// A NUL byte cannot reach a process's arguments; run is the CLI
		// without the process.
		var stdout, stderr strings.Builder
		args := []string{
			"--database-url", pgoncetest.DatabaseURL(t), "--schema", f.schema,
			"pause", "re\x00fund", "--reason", "x", "--by", "alice",
		}
		code := run(t.Context(), args, &stdout, &stderr)
		require.Equal(t, exitUsage, code, stderr.String())
		require.Contains(t, stderr.String(), "must match ^[a-z][a-z0-9_.:-]{0,63}$")
		statuses, err := f.client.Tools(t.Context())
		require.NoError(t, err)
		require.Empty(t, statuses)
		var recorded int
		require.NoError(t, pgoncetest.Pool(t).QueryRow(t.Context(),
			`SELECT count(*) FROM `+ident.Quote(f.schema)+`.pgonce_tool_action`).Scan(&recorded))
		require.Zero(t, recorded, "no decision is recorded")
	})

	t.Run("AToolNoCallUsesIsNamed", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		res := pgonce(t, "--schema", f.schema, "pause", "nosuchtool", "--reason", "incident", "--by", "alice")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Contains(t, res.stdout, "paused nosuchtool by alice")
		require.Contains(t, res.stdout, "no call of tool nosuchtool has been seen (no key of it is pending or in flight); the pause applies to future calls")
		res = pgonce(t, "--schema", f.schema, "limit", "nosuchtool", "--max-in-flight", "3", "--reason", "quota", "--by", "alice", "--json")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Equal(t, false, decodeJSON(t, res.stdout)["known"])

		// A tool with a pending key is used: nothing more is said.
		_, err := f.client.Submit(t.Context(), f.call("refund"))
		require.NoError(t, err)
		res = pgonce(t, "--schema", f.schema, "pause", "refund", "--reason", "incident", "--by", "alice")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.NotContains(t, res.stdout, "has been seen")
		res = pgonce(t, "--schema", f.schema, "limit", "refund", "--max-in-flight", "3", "--reason", "quota", "--by", "alice", "--json")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Equal(t, true, decodeJSON(t, res.stdout)["known"])
	})

	t.Run("ResumeSlowDownEndsAProvidersSlowDown", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		key, err := f.client.Submit(t.Context(), f.call("refund"))
		require.NoError(t, err)
		// A provider's slow-down of an hour, which held the pending key.
		_, err = pgoncetest.Pool(t).Exec(t.Context(), `WITH slowed AS (
				INSERT INTO `+ident.Quote(f.schema)+`.pgonce_tool (tool, not_before) VALUES ('refund', now() + interval '1 hour')
				RETURNING not_before)
			UPDATE `+ident.Quote(f.schema)+`.pgonce_key SET available_at = slowed.not_before FROM slowed`)
		require.NoError(t, err)

		res := pgonce(t, "--schema", f.schema, "resume", "refund", "--by", "alice")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Contains(t, res.stdout, "refund is not paused; nothing changed")
		res = pgonce(t, "--schema", f.schema, "resume", "refund", "--slow-down", "--by", "alice")
		require.Equal(t, exitUsage, res.code, res.stderr)
		require.Contains(t, res.stderr, "--slow-down needs --reason")

		res = pgonce(t, "--schema", f.schema, "resume", "refund", "--slow-down", "--reason", "quota raised", "--by", "alice")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Contains(t, res.stdout, "ended the slow-down of refund by alice; its keys are due now")
		status, err := f.client.Tool(t.Context(), "refund")
		require.NoError(t, err)
		require.False(t, status.SlowedDown(time.Now()))
		var due bool
		require.NoError(t, pgoncetest.Pool(t).QueryRow(t.Context(), `SELECT available_at <= now() FROM `+ident.Quote(f.schema)+`.pgonce_key`).Scan(&due))
		require.True(t, due, "the key %s the slow-down held is due", key.Key)
		res = pgonce(t, "--schema", f.schema, "tools", "refund", "--json")
		require.Equal(t, exitOK, res.code, res.stderr)
		actions, ok := decodeJSON(t, res.stdout)["actions"].([]any)
		require.True(t, ok, res.stdout)
		require.Len(t, actions, 1)
		newest, ok := actions[0].(map[string]any)
		require.True(t, ok)
		require.Equal(t, "end_slow_down", newest["action"])
		require.Equal(t, "quota raised", newest["reason"])

		res = pgonce(t, "--schema", f.schema, "resume", "refund", "--slow-down", "--reason", "again", "--by", "alice")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Contains(t, res.stdout, "refund is not slowed down; nothing changed")
	})

	t.Run("ReasonsShowTheirControlsVisibly", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		res := pgonce(t, "--schema", f.schema, "pause", "refund", "--reason", "incident \u202egnp.exe\nforged line", "--by", "alice")
		require.Equal(t, exitOK, res.code, res.stderr)
		for _, args := range [][]string{{"tools"}, {"tools", "refund"}} {
			res = pgonce(t, append([]string{"--schema", f.schema}, args...)...)
			require.Equal(t, exitOK, res.code, res.stderr)
			require.Contains(t, res.stdout, "incident <U+202E>gnp.exe<U+000A>forged line", "%q", args)
			require.NotContains(t, res.stdout, "\u202e", "%q", args)
		}
	})

	t.Run("UnmigratedSchemaFails", func(t *testing.T) {
		t.Parallel()
		res := pgonce(t, "--schema", "pgonce_never_migrated_tools", "pause", "refund", "--reason", "x", "--by", "alice")
		require.Equal(t, exitFailure, res.code, res.stderr)
		require.Contains(t, res.stderr, "migrate up")
	})
}
