package pgonceopenai_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/openai/openai-go/v3"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/agents/pgonceopenai"
	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/toolcall"
)

// observation decodes a tool message's content, which must be an
// observation's JSON.
func observation(t *testing.T, content string) map[string]any {
	t.Helper()
	var obs map[string]any
	require.NoError(t, json.Unmarshal([]byte(content), &obs), content)
	return obs
}

func newExecutor(t *testing.T, client *outbox.Client[pgx.Tx], config toolcall.Config) *pgonceopenai.Executor[pgx.Tx] {
	t.Helper()
	exec, err := pgonceopenai.New(client, config)
	require.NoError(t, err)
	return exec
}

// ask runs one turn of a runtime's loop over the Chat Completions API: the
// model's reply to the conversation, and its tool calls answered through
// exec. It returns the conversation with both, as the runtime would persist
// it.
func ask(t *testing.T, ai openai.Client, exec *pgonceopenai.Executor[pgx.Tx], runID string, messages []openai.ChatCompletionMessageParamUnion) []openai.ChatCompletionMessageParamUnion {
	t.Helper()
	completion, err := ai.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "gpt-test", Messages: messages})
	require.NoError(t, err)
	msg := completion.Choices[0].Message
	turn := pgonceopenai.ChatTurn(runID, messages)
	messages = append(messages, msg.ToParam())
	return append(messages, exec.ToolMessages(t.Context(), turn, msg)...)
}

func TestChatCompletions(t *testing.T) {
	t.Parallel()
	user := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Refund orders 8842 and 8843.")}

	t.Run("EveryCallRunsOnceAndIsAnswered", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		model, ai := newFakeModel(t)
		exec := newExecutor(t, b.client, toolcall.Config{})
		model.reply(
			chatReply("", toolCall{"call_1", "refund", `{"order":8842,"amount":"42.00"}`}, toolCall{"call_2", "refund", `{"order":8843,"amount":"7.50"}`}),
			chatReply("Both refunds are done."),
		)
		messages := ask(t, ai, exec, "run-1", user)
		_, err := ai.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "gpt-test", Messages: messages})
		require.NoError(t, err)

		read := toolMessages(t, model.lastRequest())
		require.Len(t, read, 2)
		for id, want := range map[string]string{
			"call_1": `{"refund_id": "re_\d+",  "order": 8842, "amount": "42.00"}`,
			"call_2": `{"refund_id": "re_\d+",  "order": 8843, "amount": "7.50"}`,
		} {
			require.Regexp(t, `^\{"status":"succeeded","key":"k1_[0-9a-f]{64}","response":`+want+`\}$`, read[id])
		}
		require.Equal(t, 2, b.ledger.refunds(t))
	})

	t.Run("ReaskWithReorderedArgumentsReadsTheSameBytes", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		model, ai := newFakeModel(t)
		exec := newExecutor(t, b.client, toolcall.Config{})
		// The runtime asks twice for the same turn (its first answer was
		// never persisted): the model writes the call again, with a new id,
		// the members re-ordered and the number spelled otherwise.
		model.reply(
			chatReply("", toolCall{"call_first", "refund", `{"order": 8842, "amount": "42.00"}`}),
			chatReply("", toolCall{"call_again", "refund", `{"amount":"42.00","order":8.842e3}`}),
			chatReply("Refunded."), chatReply("Refunded."),
		)
		first := ask(t, ai, exec, "run-1", user)
		again := ask(t, ai, exec, "run-1", user)
		for _, messages := range [][]openai.ChatCompletionMessageParamUnion{first, again} {
			_, err := ai.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "gpt-test", Messages: messages})
			require.NoError(t, err)
		}
		model.mu.Lock()
		readFirst := toolMessages(t, model.requests[2])["call_first"]
		readAgain := toolMessages(t, model.requests[3])["call_again"]
		model.mu.Unlock()
		require.Equal(t, "succeeded", observation(t, readFirst)["status"], readFirst)
		require.Equal(t, readFirst, readAgain, "the model reads the same bytes on every ask")
		require.NotContains(t, readAgain, "replayed")
		require.Equal(t, 1, b.ledger.refunds(t))
	})

	t.Run("InvalidModelJSONIsAnObservationNeverAPanic", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		model, ai := newFakeModel(t)
		exec := newExecutor(t, b.client, toolcall.Config{})
		model.reply(chatReply("",
			toolCall{"call_1", "refund", `{"order": 8842, "amount": "42.00"`},
			toolCall{"call_2", "refund", `"8842"`},
			toolCall{"call_3", "refund", `{"order": 8842, "order": 8843}`},
			toolCall{"call_4", "refund", `{"order": 8842, "note": "\ud800"}`},
			toolCall{"call_5", "send_money", `{}`},
		))
		messages := ask(t, ai, exec, "run-1", user)
		require.Len(t, messages, 7)
		model.reply(chatReply("Sorry."))
		_, err := ai.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "gpt-test", Messages: messages})
		require.NoError(t, err)
		read := toolMessages(t, model.lastRequest())
		for id, status := range map[string]string{
			"call_1": "invalid_arguments", "call_2": "invalid_arguments", "call_3": "invalid_arguments",
			"call_4": "invalid_arguments", "call_5": "unknown_tool",
		} {
			obs := observation(t, read[id])
			require.Equal(t, status, obs["status"], read[id])
			require.NotEmpty(t, obs["message"])
		}
		require.Equal(t, "$.order", observation(t, read["call_3"])["path"])
		require.Equal(t, int64(0), b.ledger.calls.Load(), "nothing ran")
	})

	t.Run("ReplannedStepIsAConflictTheModelCanActOn", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		model, ai := newFakeModel(t)
		exec := newExecutor(t, b.client, toolcall.Config{})
		model.reply(
			chatReply("", toolCall{"call_1", "refund", `{"order":8842,"amount":"42.00"}`}),
			chatReply("", toolCall{"call_2", "refund", `{"order":8842,"amount":"4200.00"}`}),
		)
		ask(t, ai, exec, "run-1", user)
		replanned := ask(t, ai, exec, "run-1", user)
		var content string
		require.NoError(t, json.Unmarshal(mustJSON(t, replanned[2].OfTool.Content.OfString), &content))
		obs := observation(t, content)
		require.Equal(t, "conflict", obs["status"], content)
		require.Equal(t, "refund", obs["existing_tool"])
		require.Equal(t, 1, b.ledger.refunds(t))
	})

	t.Run("ConcurrentDuplicatesRunOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		exec := newExecutor(t, b.client, toolcall.Config{})
		turn := toolcall.Turn{RunID: "run-1"}
		const asks = 8
		contents := make([]string, asks)
		var wg sync.WaitGroup
		for i := range asks {
			wg.Go(func() {
				msg := assistantMessage(t, toolCall{fmt.Sprintf("call_%d", i), "refund", `{"order":8842,"amount":"42.00"}`})
				contents[i] = exec.ToolMessages(t.Context(), turn, msg)[0].OfTool.Content.OfString.Value
			})
		}
		wg.Wait()
		for i := range asks {
			require.Equal(t, "succeeded", observation(t, contents[i])["status"], contents[i])
			require.Equal(t, contents[0], contents[i])
		}
		require.Equal(t, 1, b.ledger.refunds(t))
	})

	t.Run("CrashAfterTheProviderActedThenRestart", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		turn := toolcall.Turn{RunID: "run-1"}
		crashedProcess(t, b, func(ctx context.Context, client *outbox.Client[pgx.Tx]) {
			exec := newExecutor(t, client, toolcall.Config{})
			exec.ToolMessages(ctx, turn, assistantMessage(t, toolCall{"call_1", "refund", `{"order":8842,"amount":"42.00"}`}))
		})
		require.Equal(t, 1, b.ledger.refunds(t))

		// The new process asks the model again and runs what it answers,
		// the members re-ordered.
		exec := newExecutor(t, b.client, toolcall.Config{Wait: -1})
		reask := assistantMessage(t, toolCall{"call_2", "refund", `{"amount":"42.00","order":8842}`})
		content := exec.ToolMessages(t.Context(), turn, reask)[0].OfTool.Content.OfString.Value
		require.Equal(t, "in_progress", observation(t, content)["status"], "before the lease expires: %s", content)

		reconcileUntilResolved(t, b.client)
		content = exec.ToolMessages(t.Context(), turn, reask)[0].OfTool.Content.OfString.Value
		require.Regexp(t, `^\{"status":"succeeded","key":"k1_[0-9a-f]{64}","response":\{"refund_id": "re_1",  "order": 8842, "amount": "42.00"\}\}$`, content)
		again := exec.ToolMessages(t.Context(), turn, reask)[0].OfTool.Content.OfString.Value
		require.Equal(t, content, again)
		require.Equal(t, 1, b.ledger.refunds(t), "one refund, whatever the crash")
	})

	t.Run("SubmitChatTxBesideTheRuntimesRecord", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		exec := newExecutor(t, b.client, toolcall.Config{Mode: toolcall.Dispatched})
		turns := pgx.Identifier{b.schema, "turns"}.Sanitize()
		_, err := testPool(t).Exec(t.Context(), `CREATE TABLE `+turns+` (run_id text, first_step bigint, message jsonb)`)
		require.NoError(t, err)
		msg := assistantMessage(t, toolCall{"call_1", "refund", `{"order":8842,"amount":"42.00"}`})
		turn := pgonceopenai.ChatTurn("run-1", nil)

		tx, err := testPool(t).Begin(t.Context())
		require.NoError(t, err)
		_, err = tx.Exec(t.Context(), `INSERT INTO `+turns+` VALUES ($1, $2, $3)`, turn.RunID, turn.FirstStep, msg.RawJSON())
		require.NoError(t, err)
		submitted, err := exec.SubmitChatTx(t.Context(), tx, turn, msg)
		require.NoError(t, err)
		require.Equal(t, outbox.StatePending, submitted[0].Result.State)
		require.NoError(t, tx.Commit(t.Context()))

		disp, err := dispatcher.New(b.client, dispatcher.Config{})
		require.NoError(t, err)
		ctx, stop := context.WithCancel(context.WithoutCancel(t.Context()))
		ran := make(chan error, 1)
		go func() { ran <- disp.Run(ctx) }()
		t.Cleanup(func() {
			stop()
			require.NoError(t, <-ran)
		})
		content := exec.ToolMessages(t.Context(), turn, msg)[0].OfTool.Content.OfString.Value
		require.Equal(t, "succeeded", observation(t, content)["status"], content)
		require.Equal(t, 1, b.ledger.refunds(t))
	})
}

func TestChatTurn(t *testing.T) {
	t.Parallel()
	history := []openai.ChatCompletionMessageParamUnion{
		openai.SystemMessage("You refund orders."),
		openai.UserMessage("Refund 8842 and 8843."),
		assistantMessage(t, toolCall{"call_1", "refund", `{"order":8842}`}, toolCall{"call_2", "refund", `{"order":8843}`}).ToParam(),
		openai.ToolMessage("…", "call_1"),
		openai.ToolMessage("…", "call_2"),
		openai.AssistantMessage("Done. Anything else?"),
		openai.UserMessage("And 8844."),
		assistantMessage(t, toolCall{"call_3", "refund", `{"order":8844}`}).ToParam(),
		openai.ToolMessage("…", "call_3"),
	}
	require.Equal(t, toolcall.Turn{RunID: "run-1"}, pgonceopenai.ChatTurn("run-1", history[:2]))
	require.Equal(t, toolcall.Turn{RunID: "run-1", FirstStep: 2}, pgonceopenai.ChatTurn("run-1", history[:7]))
	require.Equal(t, toolcall.Turn{RunID: "run-1", FirstStep: 3}, pgonceopenai.ChatTurn("run-1", history))

	// The message's calls in order, whatever their ids; a custom tool's
	// input as the object {"input": …}.
	var msg openai.ChatCompletionMessage
	require.NoError(t, json.Unmarshal([]byte(`{"role":"assistant","content":null,"refusal":null,"tool_calls":[
		{"id":"call_z","type":"function","function":{"name":"refund","arguments":"{\"order\":8844}"}},
		{"id":"call_a","type":"custom","custom":{"name":"note","input":"ship it \"now\""}}]}`), &msg))
	calls := pgonceopenai.ChatCalls(toolcall.Turn{RunID: "run-1", FirstStep: 3}, msg)
	require.Equal(t, []toolcall.Call{
		{ID: "call_z", RunID: "run-1", Step: 3, Tool: "refund", Arguments: `{"order":8844}`},
		{ID: "call_a", RunID: "run-1", Step: 4, Tool: "note", Arguments: `{"input":"ship it \"now\""}`},
	}, calls)
}

// assistantMessage is a reply of the model with calls, as the SDK decodes it.
func assistantMessage(t *testing.T, calls ...toolCall) openai.ChatCompletionMessage {
	t.Helper()
	var completion openai.ChatCompletion
	require.NoError(t, json.Unmarshal([]byte(chatReply("", calls...)), &completion))
	return completion.Choices[0].Message
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}
