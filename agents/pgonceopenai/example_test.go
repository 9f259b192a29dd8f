package pgonceopenai_test

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

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/pgonce/pgonce/agents/pgonceopenai"
	"github.com/pgonce/pgonce/migrations"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/toolcall"
)

// ExampleExecutor_ToolMessages answers a model's tool calls in a Chat
// Completions loop. The model (a fake here) asks for the refund twice, the
// second time with another call id and the members re-ordered: it runs once,
// and the model reads the same tool result both times.
func ExampleExecutor_ToolMessages() {
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

	// The tool: a provider that refunds, registered under the function's
	// name.
	refunds := 0
	registry := outbox.NewRegistry()
	if err := registry.Register("refund", outbox.ProviderFunc(func(ctx context.Context, req outbox.Request) (json.RawMessage, error) {
		refunds++
		return json.RawMessage(`{"refund_id": "re_1"}`), nil
	}), outbox.IdempotentByKey); err != nil {
		panic(err)
	}
	client, err := outbox.NewPgx(pool, outbox.Config{Schema: schema, Registry: registry})
	if err != nil {
		panic(err)
	}
	exec, err := pgonceopenai.New(client, toolcall.Config{})
	if err != nil {
		panic(err)
	}

	// The model: it calls refund, each time with a new id.
	replies := []string{
		`{"id":"call_1","type":"function","function":{"name":"refund","arguments":"{\"order\": 8842, \"amount\": \"42.00\"}"}}`,
		`{"id":"call_2","type":"function","function":{"name":"refund","arguments":"{\"amount\":\"42.00\",\"order\":8842}"}}`,
	}
	model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		call := replies[0]
		replies = replies[1:]
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-example","choices":[{"index":0,
			"finish_reason":"tool_calls","message":{"role":"assistant","content":null,"refusal":null,"tool_calls":[`+call+`]}}]}`)
	}))
	defer model.Close()
	ai := openai.NewClient(option.WithBaseURL(model.URL), option.WithAPIKey("sk-example"), option.WithMaxRetries(0))

	messages := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Refund order 8842, 42.00.")}
	for range 2 { // the runtime asks twice for the same turn
		completion, err := ai.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-example", Messages: messages})
		if err != nil {
			panic(err)
		}
		msg := completion.Choices[0].Message
		turn := pgonceopenai.ChatTurn("run-8842", messages)
		for _, result := range exec.ToolMessages(ctx, turn, msg) {
			fmt.Printf("%s: %s\n", result.OfTool.ToolCallID, result.OfTool.Content.OfString.Value)
		}
	}
	fmt.Println("refunds:", refunds)
	// Output:
	// call_1: {"status":"succeeded","key":"k1_c2c82def41076a86c41bbe476d3c9096e8eef0931f8fc45ce0bc219aca3d85ae","response":{"refund_id": "re_1"}}
	// call_2: {"status":"succeeded","key":"k1_c2c82def41076a86c41bbe476d3c9096e8eef0931f8fc45ce0bc219aca3d85ae","response":{"refund_id": "re_1"}}
	// refunds: 1
}
