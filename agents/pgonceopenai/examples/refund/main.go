// Command refund tells pgonce's refund story over the OpenAI Go SDK,
// offline: a model asks for refund(order=8842, amount="42.00"); the job that
// runs the turn is delivered twice; the worker crashes after the payments API
// refunded; the restarted runtime asks the model again, which writes the call
// with its members re-ordered. One refund, and the same tool result in the
// model's context on every ask that got one.
//
// The model is a fake that speaks Chat Completions (an httptest server), and
// so is the payments API, which honours Idempotency-Key as Stripe's does;
// PostgreSQL is real. Run it with a database:
//
//	PGONCE_DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable go run ./examples/refund
//
// It migrates a schema of its own and drops it at the end.
package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/pgonce/pgonce/agents/pgonceopenai"
	"github.com/pgonce/pgonce/httpprovider"
	"github.com/pgonce/pgonce/migrations"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/reconcile"
	"github.com/pgonce/pgonce/toolcall"
)

// databaseURLDefault is the database used unless PGONCE_DATABASE_URL names
// another.
const databaseURLDefault = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

func main() {
	url := cmp.Or(os.Getenv("PGONCE_DATABASE_URL"), databaseURLDefault)
	if err := run(context.Background(), os.Stdout, url); err != nil {
		fmt.Fprintln(os.Stderr, "refund:", err)
		os.Exit(1)
	}
}

// run tells the story on the database at url, writing it to w.
func run(ctx context.Context, w io.Writer, url string) error {
	say := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	schema := "refund_example_" + strings.ToLower(rand.Text())
	db := stdlib.OpenDBFromPool(pool)
	defer func() { _ = db.Close() }()
	if err := migrations.Up(ctx, db, schema); err != nil {
		return err
	}
	defer func() {
		_, _ = pool.Exec(context.WithoutCancel(ctx), `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	}()

	payments := newPayments()
	defer payments.Close()
	model := newModel()
	defer model.Close()
	ai := openai.NewClient(option.WithBaseURL(model.URL+"/v1/"), option.WithAPIKey("sk-example"), option.WithMaxRetries(0))

	// A worker is a process of the runtime: its own pgonce client, over
	// the same schema. Its crash hook, when set, runs after the payments API
	// answered and before anything is recorded.
	newWorker := func(crash outbox.Middleware, config toolcall.Config) (*outbox.Client[pgx.Tx], *pgonceopenai.Executor[pgx.Tx], error) {
		refund, err := httpprovider.New(httpprovider.Config{URL: payments.URL + "/v1/refunds"})
		if err != nil {
			return nil, nil, err
		}
		registry := outbox.NewRegistry()
		if err := refund.Register(registry, "refund"); err != nil {
			return nil, nil, err
		}
		clientConfig := outbox.Config{Schema: schema, Registry: registry, Logger: slog.New(slog.DiscardHandler)}
		if crash != nil {
			// The shortest lease its call timeout allows, so that the
			// crashed attempt expires in about a second.
			clientConfig.Middleware = []outbox.Middleware{crash}
			clientConfig.CallTimeout = 500 * time.Millisecond
			clientConfig.Lease = clientConfig.CallTimeout + outbox.LeaseMarginMin
		}
		client, err := outbox.NewPgx(pool, clientConfig)
		if err != nil {
			return nil, nil, err
		}
		exec, err := pgonceopenai.New(client, config)
		return client, exec, err
	}

	// The conversation as the runtime persisted it before the turn; no
	// worker gets to persist the model's reply and its tool results.
	runID := "run-8842"
	conversation := []openai.ChatCompletionMessageParamUnion{
		openai.SystemMessage("You handle refunds."),
		openai.UserMessage("Please refund the 42.00 I paid for order 8842."),
	}
	// askTurn is one delivery of the job that runs the turn: ask the model,
	// run its calls, and return the tool messages.
	askTurn := func(ctx context.Context, exec *pgonceopenai.Executor[pgx.Tx]) (openai.ChatCompletionMessage, []openai.ChatCompletionMessageParamUnion, error) {
		completion, err := ai.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-example", Messages: conversation})
		if err != nil {
			return openai.ChatCompletionMessage{}, nil, err
		}
		msg := completion.Choices[0].Message
		turn := pgonceopenai.ChatTurn(runID, conversation)
		return msg, exec.ToolMessages(ctx, turn, msg), nil
	}
	describe := func(msg openai.ChatCompletionMessage) string {
		call := msg.ToolCalls[0]
		return fmt.Sprintf("%s(%s), id %s", call.Function.Name, call.Function.Arguments, call.ID)
	}

	say("1. Worker A asks the model, which calls a tool; A runs it.")
	dead := make(chan struct{})
	defer close(dead)
	crashed := make(chan struct{})
	var crashOnce sync.Once
	crash := outbox.MiddlewareFunc(func(ctx context.Context, call *outbox.ProviderCall, next func(context.Context) outbox.ProviderResult) outbox.ProviderResult {
		res := next(ctx)
		crashOnce.Do(func() { close(crashed) })
		<-dead // the process died: nothing is ever recorded
		return res
	})
	_, execA, err := newWorker(crash, toolcall.Config{})
	if err != nil {
		return err
	}
	go func() {
		// Worker A never gets to use what this returns.
		_, _, _ = askTurn(context.WithoutCancel(ctx), execA)
	}()
	select {
	case <-crashed:
	case <-ctx.Done():
		return ctx.Err()
	}
	say("   the model:        %s", model.lastCall())
	say("   the payments API: %d refund; worker A crashes before it records anything.", payments.refunds())

	say("2. The job is delivered again, to worker B, while A's claim holds.")
	_, execB, err := newWorker(nil, toolcall.Config{Wait: 200 * time.Millisecond})
	if err != nil {
		return err
	}
	msg, results, err := askTurn(ctx, execB)
	if err != nil {
		return err
	}
	status := observation(results[0]).Status
	say("   the model:        %s", describe(msg))
	say("   pgonce:           %s; B hands the model nothing and tries later.", status)
	if status != outbox.ObservationInProgress || payments.refunds() != 1 {
		return fmt.Errorf("worker B must find the refund in progress, got %s and %d refunds", status, payments.refunds())
	}

	say("3. The runtime restarts as worker C: A's lease expires, the reconciler puts")
	say("   the refund back to pending, and C asks the model again.")
	clientC, execC, err := newWorker(nil, toolcall.Config{})
	if err != nil {
		return err
	}
	if err := reconcileUntilResolved(ctx, clientC); err != nil {
		return err
	}
	msg, results, err = askTurn(ctx, execC)
	if err != nil {
		return err
	}
	first := results[0].OfTool.Content.OfString.Value
	say("   the model:        %s", describe(msg))
	say("   the tool result:  %s", first)

	say("4. C dies before it persists the turn; worker D runs it again.")
	_, execD, err := newWorker(nil, toolcall.Config{})
	if err != nil {
		return err
	}
	msg, results, err = askTurn(ctx, execD)
	if err != nil {
		return err
	}
	again := results[0].OfTool.Content.OfString.Value
	say("   the model:        %s", describe(msg))
	say("   the tool result:  %s", again)

	say("")
	say("refunds made by the payments API:  %d", payments.refunds())
	say("the same tool result on each ask:  %t", first == again)
	if payments.refunds() != 1 || first != again || observation(results[0]).Status != outbox.ObservationSucceeded {
		return fmt.Errorf("one refund and one tool result expected, got %d refunds and %q, %q", payments.refunds(), first, again)
	}
	return nil
}

// observation decodes a tool message's content.
func observation(m openai.ChatCompletionMessageParamUnion) outbox.Observation {
	var obs outbox.Observation
	_ = json.Unmarshal([]byte(m.OfTool.Content.OfString.Value), &obs)
	return obs
}

// reconcileUntilResolved runs the reconciler until it has resolved an
// expired lease: the crashed attempt's, once it expires.
func reconcileUntilResolved(ctx context.Context, client *outbox.Client[pgx.Tx]) error {
	r, err := reconcile.New(client, reconcile.Config{Grace: time.Millisecond, PruneDisabled: true})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		report, err := r.RunOnce(ctx)
		if err != nil {
			return err
		}
		if len(report.Examined) > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the crashed attempt's lease did not expire: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// payments is a fake payments API that honours Idempotency-Key: the first
// request with a key refunds, every later one gets the same answer.
type payments struct {
	*httptest.Server
	mu      sync.Mutex
	answers map[string]string
}

func newPayments() *payments {
	p := &payments{answers: map[string]string{}}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		p.mu.Lock()
		answer, ok := p.answers[key]
		if !ok {
			answer = fmt.Sprintf(`{"id": "re_%d", "status": "succeeded"}`, len(p.answers)+1)
			p.answers[key] = answer
		}
		p.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, answer)
	}))
	return p
}

func (p *payments) refunds() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.answers)
}

// model is a fake model that speaks Chat Completions: asked for the turn,
// it calls refund, each time with a new call id; from the third ask on, it
// writes the arguments' members in another order.
type model struct {
	*httptest.Server
	mu    sync.Mutex
	asks  int
	calls []string
}

func newModel() *model {
	m := &model{}
	m.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		m.asks++
		id := fmt.Sprintf("call_%c%d", 'A'+m.asks-1, 1)
		args := `{"order": 8842, "amount": "42.00"}`
		if m.asks >= 3 {
			args = `{"amount": "42.00", "order": 8842}`
		}
		m.calls = append(m.calls, fmt.Sprintf("refund(%s), id %s", args, id))
		m.mu.Unlock()
		reply, _ := json.Marshal(map[string]any{
			"id": "chatcmpl-example", "object": "chat.completion", "created": 1, "model": "gpt-example",
			"choices": []any{map[string]any{
				"index": 0, "finish_reason": "tool_calls", "logprobs": nil,
				"message": map[string]any{"role": "assistant", "content": nil, "refusal": nil, "tool_calls": []any{
					map[string]any{"id": id, "type": "function", "function": map[string]any{"name": "refund", "arguments": args}},
				}},
			}},
		})
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(reply)
	}))
	return m
}

// lastCall describes the last call the model made.
func (m *model) lastCall() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls[len(m.calls)-1]
}
