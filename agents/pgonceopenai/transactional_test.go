package pgonceopenai_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/openai/openai-go/v3"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/oncetest"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/toolcall"
)

// TestTransactionalTool checks that a tool handler written as a
// transactional tool gets the transaction its outcome is recorded in: its
// row and its outcome commit together, so a handler that dies after its
// insert leaves no row, and the re-ask writes it once.
func TestTransactionalTool(t *testing.T) {
	t.Parallel()
	p := testPool(t)
	schema := oncetest.SchemaPgx(t, p)
	table := pgx.Identifier{schema, "ticket"}.Sanitize()
	_, err := p.Exec(t.Context(), `CREATE TABLE `+table+` (key text NOT NULL, body text NOT NULL)`)
	require.NoError(t, err)
	var died atomic.Bool
	openTicket := outbox.TxProviderFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, req outbox.Request) (json.RawMessage, error) {
		if _, err := tx.Exec(ctx, `INSERT INTO `+table+` (key, body) VALUES ($1, $2)`, string(req.Key), string(req.Args)); err != nil {
			return nil, err
		}
		if died.CompareAndSwap(false, true) {
			panic("the handler dies after its insert")
		}
		return json.RawMessage(`{"opened":true}`), nil
	})
	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("open_ticket", openTicket, outbox.Transactional))
	client, err := outbox.NewPgx(p, outbox.Config{Schema: schema, Registry: registry})
	require.NoError(t, err)
	tickets := func() int {
		var n int
		require.NoError(t, p.QueryRow(t.Context(), `SELECT count(*) FROM `+table).Scan(&n))
		return n
	}

	model, ai := newFakeModel(t)
	exec := newExecutor(t, client, toolcall.Config{})
	call := toolCall{"call_1", "open_ticket", `{"subject":"refund late"}`}
	model.reply(chatReply("", call), chatReply("", call))
	user := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Open a ticket.")}

	first := ask(t, ai, exec, "run-1", user)
	require.NotEqual(t, "succeeded", observation(t, first[len(first)-1].OfTool.Content.OfString.Value)["status"])
	require.Zero(t, tickets(), "the insert rolled back with the lost outcome")

	again := ask(t, ai, exec, "run-1", user)
	require.Equal(t, "succeeded", observation(t, again[len(again)-1].OfTool.Content.OfString.Value)["status"])
	require.Equal(t, 1, tickets())
}
