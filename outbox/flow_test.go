package outbox_test

import (
	"database/sql"
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

	t.Run("AMissingNameIsRequired", func(t *testing.T) {
		t.Parallel()
		err := outbox.CheckToolName("")
		require.ErrorIs(t, err, outbox.ErrInvalidParams)
		require.Contains(t, err.Error(), "tool is required")
	})

}
