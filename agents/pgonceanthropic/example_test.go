package pgonceanthropic_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/anthropics/anthropic-sdk-go/v2/toolrunner"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgonce/pgonce/agents/pgonceanthropic"
	"github.com/pgonce/pgonce/migrations"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/toolcall"
)

// ExampleExecutor_RunnerTools makes an existing tool runner exactly-once
// without changing its loop. The runtime runs the turn twice (its first
// answer was never persisted); the model (a fake here) writes the call again
// with another id and its members re-ordered: the tool runs once, and the
// model reads the same result both times.
func ExampleExecutor_RunnerTools() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, cmp.Or(os.Getenv("PGONCE_TEST_DATABASE_URL"), databaseURLDefault))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer func() { _ = db.Close() }()
	schema := "example_" + strings.ToLower(rand.Text())
	if err := migrations.Up(ctx, db, schema); err != nil {
		panic(err)
	}
	defer func() { _, _ = db.ExecContext(context.WithoutCancel(ctx), `DROP SCHEMA "`+schema+`" CASCADE`) }()

	// The runner's tool, as it was, registered as the pgonce tool of its
	// name.
	refunds := 0
	refund := toolrunner.NewBetaTool("refund", "Refunds an order.", anthropic.BetaToolInputSchemaParam{},
		func(ctx context.Context, input json.RawMessage) (anthropic.BetaToolResultBlockParamContentUnion, error) {
			refunds++
			return anthropic.BetaToolResultBlockParamContentUnion{OfText: &anthropic.BetaTextBlockParam{Text: "refunded re_1"}}, nil
		})
	registry := outbox.NewRegistry()
	if err := registry.Register("refund", pgonceanthropic.Provider(refund), outbox.IdempotentByKey); err != nil {
		panic(err)
	}
	client, err := outbox.NewPgx(pool, outbox.Config{Schema: schema, Registry: registry})
	if err != nil {
		panic(err)
	}
	exec, err := pgonceanthropic.New(client, toolcall.Config{})
	if err != nil {
		panic(err)
	}

	// The model calls refund, then ends its turn; it reports what it read.
	inputs := []string{`{"order": 8842, "amount": "42.00"}`, `{"amount":"42.00","order":8842}`}
	model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var request struct {
			Messages []struct {
				Content json.RawMessage `json:"content"`
			} `json:"messages"`
		}
		_ = json.NewDecoder(r.Body).Decode(&request)
		content := `[{"type":"tool_use","id":"toolu_` + fmt.Sprint(len(inputs)) + `","name":"refund","input":` + inputs[0] + `}]`
		stop := "tool_use"
		if len(request.Messages) > 1 {
			fmt.Printf("the model reads: %s\n", request.Messages[len(request.Messages)-1].Content)
			content, stop = `[{"type":"text","text":"Refunded."}]`, "end_turn"
			inputs = inputs[1:]
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-example",
			"content":`+content+`,"stop_reason":"`+stop+`","stop_sequence":null,"usage":{"input_tokens":1,"output_tokens":1}}`)
	}))
	defer model.Close()
	ai := anthropic.NewClient(option.WithBaseURL(model.URL), option.WithAPIKey("sk-ant-example"), option.WithMaxRetries(0))

	for range 2 { // the runtime runs the turn twice
		var runner *anthropic.BetaToolRunner
		tools, err := exec.RunnerTools(pgonceanthropic.RunnerConfig{
			RunID:    "run-8842",
			Messages: func() []anthropic.BetaMessageParam { return runner.Messages() },
		}, refund)
		if err != nil {
			panic(err)
		}
		runner = ai.Beta.Messages.NewToolRunner(tools, anthropic.BetaToolRunnerParams{
			BetaMessageNewParams: anthropic.BetaMessageNewParams{
				Model: "claude-example", MaxTokens: 1024,
				Messages: []anthropic.BetaMessageParam{anthropic.NewBetaUserMessage(anthropic.NewBetaTextBlock("Refund order 8842, 42.00."))},
			},
			DisableThread: true,
		}, pgonceanthropic.RunnerOptions(nil)...)
		if _, err := runner.RunToCompletion(ctx); err != nil {
			panic(err)
		}
	}
	fmt.Println("refunds:", refunds)
	// Output:
	// the model reads: [{"tool_use_id":"toolu_2","content":[{"text":"refunded re_1","type":"text"}],"type":"tool_result"}]
	// the model reads: [{"tool_use_id":"toolu_1","content":[{"text":"refunded re_1","type":"text"}],"type":"tool_result"}]
	// refunds: 1
}

// ExampleExecutor_ToolResults answers the tool_use blocks of a reply of the
// Messages API: one tool_result block per call, with the observation.
func ExampleExecutor_ToolResults() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, cmp.Or(os.Getenv("PGONCE_TEST_DATABASE_URL"), databaseURLDefault))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer func() { _ = db.Close() }()
	schema := "example_" + strings.ToLower(rand.Text())
	if err := migrations.Up(ctx, db, schema); err != nil {
		panic(err)
	}
	defer func() { _, _ = db.ExecContext(context.WithoutCancel(ctx), `DROP SCHEMA "`+schema+`" CASCADE`) }()

	registry := outbox.NewRegistry()
	if err := registry.Register("refund", outbox.ProviderFunc(func(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
		return json.RawMessage(`{"refund_id": "re_1"}`), nil
	}), outbox.IdempotentByKey); err != nil {
		panic(err)
	}
	client, err := outbox.NewPgx(pool, outbox.Config{Schema: schema, Registry: registry})
	if err != nil {
		panic(err)
	}
	exec, err := pgonceanthropic.New(client, toolcall.Config{})
	if err != nil {
		panic(err)
	}

	// A reply of the model, as the SDK decodes it: a refund, and a call of
	// a tool nobody registered.
	var msg anthropic.Message
	if err := json.Unmarshal([]byte(`{"id":"msg_1","type":"message","role":"assistant","model":"claude-example","stop_reason":"tool_use",
		"content":[{"type":"tool_use","id":"toolu_1","name":"refund","input":{"order":8842,"amount":"42.00"}},
		           {"type":"tool_use","id":"toolu_2","name":"wire_money","input":{}}]}`), &msg); err != nil {
		panic(err)
	}
	history := []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Refund order 8842, 42.00."))}
	turn := pgonceanthropic.MessageTurn("run-8842", history)
	for _, block := range exec.ToolResults(ctx, turn, msg) {
		result := block.OfToolResult
		fmt.Printf("%s is_error=%t: %.60s…\n", result.ToolUseID, result.IsError.Value, result.Content[0].OfText.Text)
	}
	// Output:
	// toolu_1 is_error=false: {"status":"succeeded","key":"k1_c2c82def41076a86c41bbe476d3c…
	// toolu_2 is_error=true: {"status":"unknown_tool","message":"no tool of this name is …
}
