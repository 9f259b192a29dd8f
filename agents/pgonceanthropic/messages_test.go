package pgonceanthropic_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/agents/pgonceanthropic"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/toolcall"
)

// observation decodes a tool result, which must be an observation's JSON.
func observation(t *testing.T, text string) map[string]any {
	t.Helper()
	var obs map[string]any
	require.NoError(t, json.Unmarshal([]byte(text), &obs), text)
	return obs
}

func newExecutor(t *testing.T, client *outbox.Client[pgx.Tx], config toolcall.Config) *pgonceanthropic.Executor[pgx.Tx] {
	t.Helper()
	exec, err := pgonceanthropic.New(client, config)
	require.NoError(t, err)
	return exec
}

// ask runs one turn of a runtime's loop over the Messages API: the model's
// reply to the conversation, its tool calls answered through exec, and the
// model asked with the results. It returns what the model read.
func ask(t *testing.T, ai anthropic.Client, model *fakeModel, exec *pgonceanthropic.Executor[pgx.Tx], runID string, messages []anthropic.MessageParam) map[string]toolResult {
	t.Helper()
	params := anthropic.MessageNewParams{Model: "claude-test", MaxTokens: 1024, Messages: messages}
	msg, err := ai.Messages.New(t.Context(), params)
	require.NoError(t, err)
	turn := pgonceanthropic.MessageTurn(runID, params.Messages)
	results := exec.ToolResults(t.Context(), turn, *msg)
	params.Messages = append(params.Messages, msg.ToParam(), anthropic.NewUserMessage(results...))
	model.reply(reply())
	_, err = ai.Messages.New(t.Context(), params)
	require.NoError(t, err)
	model.mu.Lock()
	last := len(model.requests) - 1
	model.mu.Unlock()
	return toolResults(t, model.request(last))
}

// toolUseMessage is a reply of the model with tool_use blocks, as the SDK
// decodes it.
func toolUseMessage(t *testing.T, uses ...toolUse) anthropic.Message {
	t.Helper()
	var msg anthropic.Message
	require.NoError(t, json.Unmarshal([]byte(reply(uses...)), &msg))
	return msg
}

func TestMessages(t *testing.T) {
	t.Parallel()
	user := []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Refund orders 8842 and 8843."))}

	t.Run("EveryToolUseRunsOnceAndIsAnswered", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		model, ai := newFakeModel(t)
		exec := newExecutor(t, b.client, toolcall.Config{})
		model.reply(reply(toolUse{"toolu_1", "refund", `{"order":8842,"amount":"42.00"}`}, toolUse{"toolu_2", "refund", `{"order":8843,"amount":"7.50"}`}))
		read := ask(t, ai, model, exec, "run-1", user)
		require.Len(t, read, 2)
		for id, want := range map[string]string{
			"toolu_1": `{"refund_id": "re_\d+",  "order": 8842, "amount": "42.00"}`,
			"toolu_2": `{"refund_id": "re_\d+",  "order": 8843, "amount": "7.50"}`,
		} {
			require.Regexp(t, `^\{"status":"succeeded","key":"k1_[0-9a-f]{64}","response":`+want+`\}$`, read[id].text)
			require.False(t, read[id].isError)
		}
		require.Equal(t, 2, b.ledger.refunds(t))
	})

	t.Run("ReaskWithReorderedInputReadsTheSameBytes", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		model, ai := newFakeModel(t)
		exec := newExecutor(t, b.client, toolcall.Config{})
		model.reply(reply(toolUse{"toolu_first", "refund", `{"order": 8842, "amount": "42.00"}`}))
		first := ask(t, ai, model, exec, "run-1", user)["toolu_first"]
		// The runtime asks for the same turn again: a new id, the members
		// re-ordered, the number spelled otherwise.
		model.reply(reply(toolUse{"toolu_again", "refund", `{"amount":"42.00","order":8842.0}`}))
		again := ask(t, ai, model, exec, "run-1", user)["toolu_again"]
		require.Equal(t, "succeeded", observation(t, first.text)["status"], first.text)
		require.Equal(t, first, again, "the model reads the same bytes on every ask")
		require.NotContains(t, again.text, "replayed")
		require.Equal(t, 1, b.ledger.refunds(t))
	})

	t.Run("InvalidInputIsAnErrorResultNeverAPanic", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		model, ai := newFakeModel(t)
		exec := newExecutor(t, b.client, toolcall.Config{})
		model.reply(reply(
			toolUse{"toolu_1", "refund", `{"order": 8842, "order": 8843}`},
			toolUse{"toolu_2", "refund", `{"order": 8842, "note": "\ud800"}`},
			toolUse{"toolu_3", "refund", `[8842]`},
			toolUse{"toolu_4", "wire_money", `{}`},
		))
		read := ask(t, ai, model, exec, "run-1", user)
		for id, status := range map[string]string{
			"toolu_1": "invalid_arguments", "toolu_2": "invalid_arguments",
			"toolu_3": "invalid_arguments", "toolu_4": "unknown_tool",
		} {
			require.Equal(t, status, observation(t, read[id].text)["status"], read[id].text)
			require.True(t, read[id].isError)
		}
		// A tool_use whose input a stream cut short, as MessageCalls finds it.
		msg := toolUseMessage(t, toolUse{"toolu_5", "refund", `{"order": 8842}`})
		calls := pgonceanthropic.MessageCalls(toolcall.Turn{RunID: "run-1"}, msg)
		calls[0].Arguments = `{"order": 88`
		out := exec.Run(t.Context(), calls...)[0]
		require.ErrorIs(t, out.Err, toolcall.ErrInvalidArguments)
		require.Equal(t, int64(0), b.ledger.calls.Load(), "nothing ran")
	})

	t.Run("ReplannedStepIsAConflict", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		model, ai := newFakeModel(t)
		exec := newExecutor(t, b.client, toolcall.Config{})
		model.reply(reply(toolUse{"toolu_1", "refund", `{"order":8842,"amount":"42.00"}`}))
		ask(t, ai, model, exec, "run-1", user)
		model.reply(reply(toolUse{"toolu_2", "refund", `{"order":8842,"amount":"4200.00"}`}))
		read := ask(t, ai, model, exec, "run-1", user)["toolu_2"]
		require.Equal(t, "conflict", observation(t, read.text)["status"], read.text)
		require.True(t, read.isError)
		require.Equal(t, 1, b.ledger.refunds(t))
	})

	t.Run("ConcurrentDuplicatesRunOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		exec := newExecutor(t, b.client, toolcall.Config{})
		const asks = 8
		texts := make([]string, asks)
		var wg sync.WaitGroup
		for i := range asks {
			wg.Go(func() {
				msg := toolUseMessage(t, toolUse{fmt.Sprintf("toolu_%d", i), "refund", `{"order":8842,"amount":"42.00"}`})
				texts[i] = exec.ToolResults(t.Context(), toolcall.Turn{RunID: "run-1"}, msg)[0].OfToolResult.Content[0].OfText.Text
			})
		}
		wg.Wait()
		for i := range asks {
			require.Equal(t, "succeeded", observation(t, texts[i])["status"], texts[i])
			require.Equal(t, texts[0], texts[i])
		}
		require.Equal(t, 1, b.ledger.refunds(t))
	})

	t.Run("CrashAfterTheProviderActedThenRestart", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		turn := toolcall.Turn{RunID: "run-1"}
		crashedProcess(t, b, func(ctx context.Context, client *outbox.Client[pgx.Tx]) {
			exec := newExecutor(t, client, toolcall.Config{})
			exec.ToolResults(ctx, turn, toolUseMessage(t, toolUse{"toolu_1", "refund", `{"order":8842,"amount":"42.00"}`}))
		})
		require.Equal(t, 1, b.ledger.refunds(t))

		exec := newExecutor(t, b.client, toolcall.Config{Wait: -1})
		reask := toolUseMessage(t, toolUse{"toolu_2", "refund", `{"amount":"42.00","order":8842}`})
		result := exec.ToolResults(t.Context(), turn, reask)[0].OfToolResult
		require.Equal(t, "in_progress", observation(t, result.Content[0].OfText.Text)["status"], "before the lease expires")
		require.True(t, result.IsError.Value)

		reconcileUntilResolved(t, b.client)
		text := exec.ToolResults(t.Context(), turn, reask)[0].OfToolResult.Content[0].OfText.Text
		require.Regexp(t, `^\{"status":"succeeded","key":"k1_[0-9a-f]{64}","response":\{"refund_id": "re_1",  "order": 8842, "amount": "42.00"\}\}$`, text)
		again := exec.ToolResults(t.Context(), turn, reask)[0].OfToolResult.Content[0].OfText.Text
		require.Equal(t, text, again)
		require.Equal(t, 1, b.ledger.refunds(t), "one refund, whatever the crash")
	})

	t.Run("SubmitMessageTxBesideTheRuntimesRecord", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		exec := newExecutor(t, b.client, toolcall.Config{})
		msg := toolUseMessage(t, toolUse{"toolu_1", "refund", `{"order":8842,"amount":"42.00"}`})
		turn := pgonceanthropic.MessageTurn("run-1", user)
		tx, err := testPool(t).Begin(t.Context())
		require.NoError(t, err)
		submitted, err := exec.SubmitMessageTx(t.Context(), tx, turn, msg)
		require.NoError(t, err)
		require.Equal(t, outbox.StatePending, submitted[0].Result.State)
		require.NoError(t, tx.Rollback(t.Context()))
		_, err = b.client.Get(t.Context(), submitted[0].Result.Key)
		require.ErrorIs(t, err, outbox.ErrNotFound, "rolled back with the runtime's record")

		tx, err = testPool(t).Begin(t.Context())
		require.NoError(t, err)
		_, err = exec.SubmitMessageTx(t.Context(), tx, turn, msg)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(t.Context()))
		text := exec.ToolResults(t.Context(), turn, msg)[0].OfToolResult.Content[0].OfText.Text
		require.Equal(t, "succeeded", observation(t, text)["status"], text)
		require.Equal(t, 1, b.ledger.refunds(t))
	})
}

func TestMessageTurn(t *testing.T) {
	t.Parallel()
	history := []anthropic.MessageParam{
		anthropic.NewUserMessage(anthropic.NewTextBlock("Refund 8842 and 8843.")),
		toolUseMessage(t, toolUse{"toolu_1", "refund", `{"order":8842}`}, toolUse{"toolu_2", "refund", `{"order":8843}`}).ToParam(),
		anthropic.NewUserMessage(anthropic.NewToolResultBlock("toolu_1", "…", false), anthropic.NewToolResultBlock("toolu_2", "…", false)),
		toolUseMessage(t).ToParam(),
		anthropic.NewUserMessage(anthropic.NewTextBlock("And 8844.")),
	}
	require.Equal(t, toolcall.Turn{RunID: "run-1"}, pgonceanthropic.MessageTurn("run-1", history[:1]))
	require.Equal(t, toolcall.Turn{RunID: "run-1", FirstStep: 2}, pgonceanthropic.MessageTurn("run-1", history))

	msg := toolUseMessage(t, toolUse{"toolu_z", "refund", `{"order": 8844}`}, toolUse{"toolu_a", "note", `{"text": "ship"}`})
	require.Equal(t, []toolcall.Call{
		{ID: "toolu_z", RunID: "run-1", Step: 2, Tool: "refund", Arguments: `{"order":8844}`},
		{ID: "toolu_a", RunID: "run-1", Step: 3, Tool: "note", Arguments: `{"text":"ship"}`},
	}, pgonceanthropic.MessageCalls(pgonceanthropic.MessageTurn("run-1", history), msg))
}
