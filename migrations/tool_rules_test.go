package migrations_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/migrations"
)

// TestToolRules checks migration 00007: the flow control of a tool name no
// call can have, which earlier versions accepted, is deleted (its decisions
// are kept), such a name is refused from then on, and an ended slow-down is
// a decision of its own, which going down records as a resume.
func TestToolRules(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgoncetest.DB(t)
	schema := pgoncetest.NewSchemaName(t)
	t.Cleanup(func() { pgoncetest.DropSchema(t, schema) })
	provider, err := migrations.NewProvider(db, schema)
	require.NoError(t, err)
	_, err = provider.UpTo(ctx, 6)
	require.NoError(t, err)
	q := `"` + schema + `".`
	_, err = db.ExecContext(ctx, `INSERT INTO `+q+`pgonce_tool (tool, max_in_flight) VALUES ('refund', 5), ('Refund', 5), ('a b', 1)`)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `INSERT INTO `+q+`pgonce_tool_action (tool, action, acted_by, reason) VALUES ('Refund', 'limit', 'alice', 'typo')`)
	require.NoError(t, err)

	_, err = provider.UpTo(ctx, 7)
	require.NoError(t, err)
	var tools []string
	rows, err := db.QueryContext(ctx, `SELECT tool FROM `+q+`pgonce_tool ORDER BY tool`)
	require.NoError(t, err)
	for rows.Next() {
		var tool string
		require.NoError(t, rows.Scan(&tool))
		tools = append(tools, tool)
	}
	require.NoError(t, rows.Err())
	require.NoError(t, rows.Close())
	require.Equal(t, []string{"refund"}, tools)
	var kept int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM `+q+`pgonce_tool_action WHERE tool = 'Refund'`).Scan(&kept))
	require.Equal(t, 1, kept, "the decisions stay")
	for _, name := range []string{"Refund", "a b", strings.Repeat("t", 65)} {
		_, err = db.ExecContext(ctx, `INSERT INTO `+q+`pgonce_tool (tool, max_in_flight) VALUES ($1, 1)`, name)
		require.ErrorContains(t, err, "pgonce_tool_name_check", name)
	}
	_, err = db.ExecContext(ctx, `INSERT INTO `+q+`pgonce_tool_action (tool, action, acted_by, reason) VALUES ('refund', 'end_slow_down', 'alice', 'quota')`)
	require.NoError(t, err)

	_, err = provider.DownTo(ctx, 6)
	require.NoError(t, err)
	var action string
	require.NoError(t, db.QueryRowContext(ctx, `SELECT action FROM `+q+`pgonce_tool_action WHERE tool = 'refund'`).Scan(&action))
	require.Equal(t, "resume", action)
}
