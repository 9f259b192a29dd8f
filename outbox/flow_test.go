package outbox_test

import (
	"database/sql"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

func TestToolFlowControl(t *testing.T) {
	t.Parallel()
	eachHarness(t, testToolFlowControl[pgx.Tx], testToolFlowControl[*sql.Tx])
}

func testToolFlowControl[TTx any](t *testing.T, h driverHarness[TTx]) {
	t.Helper()

	type testBundle struct {
		client *outbox.Client[TTx]
		schema string
	}
	setup := func(t *testing.T) *testBundle {
		t.Helper()
		schema := pgoncetest.Schema(t)
		return &testBundle{client: h.newClient(t, outbox.Config{Schema: schema}), schema: schema}
	}
	// rows counts the rows of one of the schema's tables.
	rows := func(t *testing.T, b *testBundle, table string) int {
		t.Helper()
		var n int
		require.NoError(t, pgoncetest.Pool(t).QueryRow(t.Context(),
			`SELECT count(*) FROM `+ident.Quote(b.schema)+`.`+ident.Quote(table)).Scan(&n))
		return n
	}

	t.Run("NamesNoCallCanHaveAreRefused", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, name := range []string{
			"Bad Tool!", "Refund", "a b", "1refund", "_refund", "refund/v2", "réfund",
			strings.Repeat("t", 65), "re\x00fund", "re\xfffund", strings.Repeat("t", 3000),
		} {
			acts := map[string]func() error{
				"Pause": func() error {
					_, err := b.client.Pause(t.Context(), name, outbox.PauseParams{By: "alice", Reason: "incident"})
					return err
				},
				"Resume": func() error {
					_, err := b.client.Resume(t.Context(), name, outbox.ResumeParams{By: "alice"})
					return err
				},
				"SetToolLimits": func() error {
					_, err := b.client.SetToolLimits(t.Context(), name, outbox.ToolLimits{MaxInFlight: 5}, outbox.LimitParams{By: "alice", Reason: "quota"})
					return err
				},
				"ClearToolLimits": func() error {
					_, err := b.client.SetToolLimits(t.Context(), name, outbox.ToolLimits{}, outbox.LimitParams{By: "alice", Reason: "quota"})
					return err
				},
				"ToolActions": func() error {
					_, err := b.client.ToolActions(t.Context(), name)
					return err
				},
			}
			for act, do := range acts {
				err := do()
				require.ErrorIs(t, err, outbox.ErrInvalidParams, "%s(%q)", act, name)
				require.Contains(t, err.Error(), "must match ^[a-z][a-z0-9_.:-]{0,63}$", "%s(%q)", act, name)
			}
			require.ErrorIs(t, outbox.CheckToolName(name), outbox.ErrInvalidParams, name)
		}
		tools, err := b.client.Tools(t.Context())
		require.NoError(t, err)
		require.Empty(t, tools, "nothing is listed")
		require.Zero(t, rows(t, b, "pgonce_tool"))
		require.Zero(t, rows(t, b, "pgonce_tool_action"), "nothing is recorded")
	})

	t.Run("EveryNameACallMayHaveIsAccepted", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, name := range []string{"refund", "r", "stripe.refund:v2-beta_1", strings.Repeat("t", 64)} {
			require.NoError(t, outbox.CheckToolName(name), name)
			status, err := b.client.Pause(t.Context(), name, outbox.PauseParams{By: "alice", Reason: "incident"})
			require.NoError(t, err, name)
			require.True(t, status.Paused, name)
		}
	})

	t.Run("ANameNoCallUsesIsNotKnown", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		status, err := b.client.Pause(t.Context(), "nosuchtool", outbox.PauseParams{By: "alice", Reason: "incident"})
		require.NoError(t, err)
		require.True(t, status.Paused, "the pause applies to calls yet to come")
		require.False(t, status.Known)
		tools, err := b.client.Tools(t.Context())
		require.NoError(t, err)
		require.Len(t, tools, 1)
		require.False(t, tools[0].Known)
		status, err = b.client.Tool(t.Context(), "othertool")
		require.NoError(t, err)
		require.False(t, status.Known, "a tool without flow control either")
	})

	t.Run("ARegisteredToolOrOneWithOpenKeysIsKnown", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		registry := outbox.NewRegistry()
		ok := func() (json.RawMessage, error) { return json.RawMessage(`{}`), nil }
		require.NoError(t, registry.Register("refund", &answers{answers: []func() (json.RawMessage, error){ok}}, outbox.IdempotentByKey))
		require.NoError(t, registry.Register("email", &answers{answers: []func() (json.RawMessage, error){ok}}, outbox.AtMostOnce))
		service := h.newClient(t, outbox.Config{Schema: b.schema, Registry: registry})

		// The service's client knows its registered tools, keys or not.
		for _, tool := range []string{"refund", "email"} {
			status, err := service.Tool(t.Context(), tool)
			require.NoError(t, err)
			require.True(t, status.Known, tool)
		}
		status, err := service.SetToolLimits(t.Context(), "email", outbox.ToolLimits{MaxInFlight: 3}, outbox.LimitParams{By: "alice", Reason: "quota"})
		require.NoError(t, err)
		require.True(t, status.Known)

		// A client without the registry (the CLI's) knows a tool by its
		// pending or in-flight keys.
		_, err = service.Submit(t.Context(), outbox.Call{RunID: "run-1", Step: 1, Tool: "refund", Args: map[string]any{"order": 1}})
		require.NoError(t, err)
		status, err = b.client.Tool(t.Context(), "refund")
		require.NoError(t, err)
		require.True(t, status.Known, "a pending key, without flow control")
		status, err = b.client.Pause(t.Context(), "refund", outbox.PauseParams{By: "alice", Reason: "incident"})
		require.NoError(t, err)
		require.True(t, status.Known, "a pending key, paused")
		_, err = pgoncetest.Pool(t).Exec(t.Context(), `UPDATE `+ident.Quote(b.schema)+`.pgonce_key
			SET attempt = 1, lease_until = now() + interval '1 minute', worker = 'w', first_attempted_at = now(), updated_at = now()`)
		require.NoError(t, err)
		status, err = b.client.Tool(t.Context(), "refund")
		require.NoError(t, err)
		require.True(t, status.Known, "a key in flight")
		tools, err := b.client.Tools(t.Context())
		require.NoError(t, err)
		require.Len(t, tools, 2)
		require.Equal(t, "email", tools[0].Tool)
		require.False(t, tools[0].Known, "no key of email, and no registry here")
		require.True(t, tools[1].Known)
	})

	t.Run("AMissingNameIsRequired", func(t *testing.T) {
		t.Parallel()
		err := outbox.CheckToolName("")
		require.ErrorIs(t, err, outbox.ErrInvalidParams)
		require.Contains(t, err.Error(), "tool is required")
	})
}
