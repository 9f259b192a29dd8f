package pgonceanthropic_test

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/anthropics/anthropic-sdk-go/v2/toolrunner"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/pgonce/pgonce/agents/pgonceanthropic"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/toolcall"
)

// executions counts a tool's runs and keeps the keys it ran for. The refund
// tool honours keys, so a run again with a key is a legitimate retry (an
// attempt past its call timeout on a busy machine): a test counts the keys
// acted on, and runs only where none may happen.
type executions struct {
	runs atomic.Int64
	keys sync.Map // outbox.Key → struct{}
}

func (e *executions) add(ctx context.Context) {
	e.runs.Add(1)
	if req, ok := toolcall.RequestFromContext(ctx); ok {
		e.keys.Store(req.Key, struct{}{})
	}
}

// actedOn returns how many distinct keys the tool ran for.
func (e *executions) actedOn() int {
	n := 0
	e.keys.Range(func(any, any) bool {
		n++
		return true
	})
	return n
}

// newRefundTool is a tool of a tool runner, as its users write them: it
// refunds through the ledger, with the key pgonce passes it.
func newRefundTool(l *ledger, executed *executions, fail error) anthropic.BetaTool {
	return toolrunner.NewBetaTool("refund", "Refunds an order.",
		anthropic.BetaToolInputSchemaParam{Properties: map[string]any{
			"order":  map[string]any{"type": "integer"},
			"amount": map[string]any{"type": "string"},
		}},
		func(ctx context.Context, input json.RawMessage) (anthropic.BetaToolResultBlockParamContentUnion, error) {
			executed.add(ctx)
			if fail != nil {
				return anthropic.BetaToolResultBlockParamContentUnion{}, fail
			}
			req, ok := toolcall.RequestFromContext(ctx)
			if !ok {
				return anthropic.BetaToolResultBlockParamContentUnion{}, errors.New("no pgonce request")
			}
			resp, err := l.Call(ctx, req)
			if err != nil {
				return anthropic.BetaToolResultBlockParamContentUnion{}, err
			}
			return anthropic.BetaToolResultBlockParamContentUnion{OfText: &anthropic.BetaTextBlockParam{Text: "refunded: " + string(resp)}}, nil
		})
}

// runnerProcess is one process of a runtime that runs a tool runner: its
// client, with the refund tool registered, and its executor.
func runnerProcess(t *testing.T, b *bundle, tool anthropic.BetaTool, config outbox.Config) *pgonceanthropic.Executor[pgx.Tx] {
	t.Helper()
	return newExecutor(t, newClient(t, b.schema, pgonceanthropic.Provider(tool), config), toolcall.Config{Wait: -1})
}

// runTurn runs a new tool runner over the user's message to completion,
// with the tools exec makes exactly-once.
func runTurn(t *testing.T, ctx context.Context, ai anthropic.Client, exec *pgonceanthropic.Executor[pgx.Tx], tool anthropic.BetaTool) error {
	t.Helper()
	return runShuffledTurn(t, ctx, ai, exec, tool, false, pgonceanthropic.RunnerOptions(nil)...)
}

// runShuffledTurn is runTurn, with a random delay before each of the
// runner's tool calls when shuffle is set, so that the calls of one message
// reach pgonce in an order of their own each time, and the runner created
// with opts.
func runShuffledTurn(t *testing.T, ctx context.Context, ai anthropic.Client, exec *pgonceanthropic.Executor[pgx.Tx], tool anthropic.BetaTool, shuffle bool, opts ...option.RequestOption) error {
	t.Helper()
	var runner *anthropic.BetaToolRunner
	tools, err := exec.RunnerTools(pgonceanthropic.RunnerConfig{
		RunID:    "run-1",
		Messages: func() []anthropic.BetaMessageParam { return runner.Messages() },
	}, tool)
	require.NoError(t, err)
	if shuffle {
		for i := range tools {
			tools[i] = delayedTool{tools[i]}
		}
	}
	runner = ai.Beta.Messages.NewToolRunner(tools, anthropic.BetaToolRunnerParams{
		BetaMessageNewParams: anthropic.BetaMessageNewParams{
			Model: "claude-test", MaxTokens: 1024,
			Messages: []anthropic.BetaMessageParam{anthropic.NewBetaUserMessage(anthropic.NewBetaTextBlock("Refund order 8842, 42.00."))},
		},
		DisableThread: true,
	}, opts...)
	_, err = runner.RunToCompletion(ctx)
	return err
}

// delayedTool runs its tool after a random delay of up to 5ms.
type delayedTool struct{ anthropic.BetaTool }

func (d delayedTool) Execute(ctx context.Context, input json.RawMessage) ([]anthropic.BetaToolResultBlockParamContentUnion, error) {
	select {
	case <-time.After(time.Duration(rand.Int64N(int64(5 * time.Millisecond)))):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return d.BetaTool.Execute(ctx, input)
}

func TestRunnerTools(t *testing.T) {
	t.Parallel()

	t.Run("IdenticalCallsTakeTheirPositionsInTheMessagesOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		model, ai := newFakeModel(t)
		var executed executions
		tool := newRefundTool(b.ledger, &executed, nil)
		client := newClient(t, b.schema, pgonceanthropic.Provider(tool), outbox.Config{})
		exec := newExecutor(t, client, toolcall.Config{Wait: -1})
		const args = `{"order":8842,"amount":"42.00"}`
		calls := []toolUse{
			{"toolu_1", "refund", args},
			{"toolu_2", "refund", args},
			{"toolu_3", "refund", `{"order":8843,"amount":"7.50"}`},
			{"toolu_4", "refund", args},
			{"toolu_5", "refund", args},
		}
		// The first run, and the same conversation run again: the tools run
		// concurrently, each after a delay of its own, yet every block reads
		// the outcome of its own position, and that outcome names its id.
		for run := range 6 {
			// Spans to the registered provider, or to one of the runtime's.
			var provider trace.TracerProvider
			if run%2 == 1 {
				provider = noop.NewTracerProvider()
			}
			model.reply(reply(calls...), reply())
			require.NoError(t, runShuffledTurn(t, t.Context(), ai, exec, tool, true, pgonceanthropic.RunnerOptions(provider)...))
			results := toolResults(t, model.request(2*run+1))
			require.Len(t, results, len(calls))
			for step, c := range calls {
				key, err := outbox.DeriveKey(outbox.Call{RunID: "run-1", Step: int64(step), Tool: "refund", Args: json.RawMessage(c.input)})
				require.NoError(t, err)
				inspection, err := client.Inspect(t.Context(), key)
				require.NoError(t, err)
				require.Equal(t, c.id, inspection.Metadata[toolcall.MetadataToolCallID], "run %d, step %d", run, step)
				require.False(t, results[c.id].isError, results[c.id].text)
				var stored []struct{ Text string }
				require.NoError(t, json.Unmarshal(inspection.Response, &stored))
				require.Len(t, stored, 1)
				require.Equal(t, stored[0].Text, results[c.id].text, "run %d: %s reads step %d", run, c.id, step)
			}
		}
		require.Equal(t, 5, b.ledger.refunds(t))
		require.Equal(t, 5, executed.actedOn())
	})

	t.Run("AnExistingRunnerBecomesExactlyOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		model, ai := newFakeModel(t)
		var executed executions
		tool := newRefundTool(b.ledger, &executed, nil)
		exec := runnerProcess(t, b, tool, outbox.Config{})
		// Two identical calls in one message are two positions, two
		// actions; asked again, each reads its own outcome.
		calls := []toolUse{
			{"toolu_1", "refund", `{"order":8842,"amount":"42.00"}`},
			{"toolu_2", "refund", `{"order":8842,"amount":"42.00"}`},
			{"toolu_3", "refund", `{"order":8843,"amount":"7.50"}`},
		}
		model.reply(reply(calls...), reply())
		require.NoError(t, runTurn(t, t.Context(), ai, exec, tool))
		first := toolResults(t, model.request(1))
		require.Len(t, first, 3)
		for _, c := range calls {
			require.False(t, first[c.id].isError, first[c.id].text)
			require.Regexp(t, `^refunded: \{"refund_id": "re_\d",  "order": 884\d, "amount": "[0-9.]+"\}$`, first[c.id].text)
		}
		require.NotEqual(t, first["toolu_1"].text, first["toolu_2"].text)
		require.Equal(t, 3, b.ledger.refunds(t))

		// The runtime runs the turn again (its result was never persisted):
		// the model writes the same calls with new ids and re-spelled input.
		model.reply(reply(
			toolUse{"toolu_4", "refund", `{"amount":"42.00","order":8842}`},
			toolUse{"toolu_5", "refund", `{"amount":"42.00","order":8842}`},
			toolUse{"toolu_6", "refund", `{"amount":"7.50","order":8843.0}`},
		), reply())
		require.NoError(t, runTurn(t, t.Context(), ai, exec, tool))
		again := toolResults(t, model.request(3))
		require.Equal(t,
			[]string{first["toolu_1"].text, first["toolu_2"].text, first["toolu_3"].text},
			[]string{again["toolu_4"].text, again["toolu_5"].text, again["toolu_6"].text})
		require.Equal(t, 3, b.ledger.refunds(t))
		require.Equal(t, 3, executed.actedOn(), "the tool acted once per action")
	})

	t.Run("IdenticalCallsWithoutTheRunnerOptionsRunNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		model, ai := newFakeModel(t)
		var executed executions
		tool := newRefundTool(b.ledger, &executed, nil)
		exec := runnerProcess(t, b, tool, outbox.Config{})
		model.reply(reply(
			toolUse{"toolu_1", "refund", `{"order":8842,"amount":"42.00"}`},
			toolUse{"toolu_2", "refund", `{"amount":"42.00","order":8842}`},
			toolUse{"toolu_3", "refund", `{"order":8843,"amount":"7.50"}`},
		), reply())
		require.NoError(t, runShuffledTurn(t, t.Context(), ai, exec, tool, false))
		results := toolResults(t, model.request(1))
		for _, id := range []string{"toolu_1", "toolu_2"} {
			require.True(t, results[id].isError)
			require.Equal(t, "Error: "+pgonceanthropic.ErrIdenticalCalls.Error(), results[id].text)
		}
		require.False(t, results["toolu_3"].isError, "a call of its own is located by its input")
		require.Equal(t, 1, b.ledger.refunds(t))
	})

	t.Run("CrashAfterTheToolActedThenRestart", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		model, ai := newFakeModel(t)
		var executed executions
		model.reply(reply(toolUse{"toolu_1", "refund", `{"order":8842,"amount":"42.00"}`}))
		crashedProcess(t, b, func(ctx context.Context, client *outbox.Client[pgx.Tx]) {
			// The process's tool refunds through the crashing provider the
			// client was made with; the runner's tool only names it.
			exec := newExecutor(t, client, toolcall.Config{})
			_ = runTurn(t, ctx, ai, exec, newRefundTool(b.ledger, &executed, nil))
		})
		require.Equal(t, 1, b.ledger.refunds(t))

		tool := newRefundTool(b.ledger, &executed, nil)
		exec := runnerProcess(t, b, tool, outbox.Config{})
		model.reply(reply(toolUse{"toolu_2", "refund", `{"amount":"42.00","order":8842}`}), reply())
		require.NoError(t, runTurn(t, t.Context(), ai, exec, tool))
		inProgress := toolResults(t, model.request(2))["toolu_2"]
		require.True(t, inProgress.isError)
		require.Regexp(t, `^Error: \{"status":"in_progress",`, inProgress.text, "before the lease expires")

		reconcileUntilResolved(t, b.client)
		for i := range 2 {
			model.reply(reply(toolUse{"toolu_3", "refund", `{"amount":"42.00","order":8842}`}), reply())
			require.NoError(t, runTurn(t, t.Context(), ai, exec, tool))
			read := toolResults(t, model.request(4+2*i))["toolu_3"]
			require.False(t, read.isError, read.text)
			require.Equal(t, `refunded: {"refund_id": "re_1",  "order": 8842, "amount": "42.00"}`, read.text)
		}
		require.Equal(t, 1, b.ledger.refunds(t), "one refund, whatever the crash")
	})

	t.Run("AToolErrorIsItsAnswerStoredAndReplayed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		model, ai := newFakeModel(t)
		var executed executions
		tool := newRefundTool(b.ledger, &executed, errors.New("order 8842 was never paid"))
		exec := runnerProcess(t, b, tool, outbox.Config{})
		var texts []string
		for i := range 2 {
			model.reply(reply(toolUse{"toolu_1", "refund", `{"order":8842,"amount":"42.00"}`}), reply())
			require.NoError(t, runTurn(t, t.Context(), ai, exec, tool))
			read := toolResults(t, model.request(1+2*i))["toolu_1"]
			require.True(t, read.isError)
			texts = append(texts, read.text)
		}
		require.Regexp(t, `^Error: \{"status":"failed","key":"k1_[0-9a-f]{64}","failure":\{"error":"order 8842 was never paid"\}\}$`, texts[0])
		require.Equal(t, texts[0], texts[1])
		require.Equal(t, 1, executed.actedOn())
	})

	t.Run("ACallOutsideTheConversationNeverRuns", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var executed executions
		tool := newRefundTool(b.ledger, &executed, nil)
		exec := runnerProcess(t, b, tool, outbox.Config{})
		var conversation []anthropic.BetaMessageParam
		tools, err := exec.RunnerTools(pgonceanthropic.RunnerConfig{RunID: "run-1", Messages: func() []anthropic.BetaMessageParam { return conversation }}, tool)
		require.NoError(t, err)
		_, err = tools[0].Execute(t.Context(), json.RawMessage(`{"order":8842,"amount":"42.00"}`))
		require.ErrorIs(t, err, pgonceanthropic.ErrNotInConversation)
		conversation = []anthropic.BetaMessageParam{{OfAssistant: &anthropic.BetaAssistantMessageParam{Content: []anthropic.BetaContentBlockParamUnion{
			{OfToolUse: &anthropic.BetaToolUseBlockParam{ID: "toolu_1", Name: "refund", Input: json.RawMessage(`{"order":8843,"amount":"1.00"}`)}},
		}}}}
		_, err = tools[0].Execute(t.Context(), json.RawMessage(`{"order":8842,"amount":"42.00"}`))
		require.ErrorIs(t, err, pgonceanthropic.ErrNotInConversation)
		require.Equal(t, int64(0), executed.runs.Load())

		_, err = exec.RunnerTools(pgonceanthropic.RunnerConfig{RunID: "run-1"}, tool)
		require.ErrorIs(t, err, pgonceanthropic.ErrInvalidRunner)
	})
}
