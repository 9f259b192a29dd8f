// Command refund tells pgonce's refund story over the Anthropic Go SDK's tool
// runner, offline: a model asks for refund(order=8842, amount="42.00"); the
// worker crashes after the payments API refunded; the job is delivered again
// to a worker that waits for the crashed attempt to be settled; and the turn
// is run once more, the model writing the call with its members re-ordered.
// One refund, and the same tool result in the model's context on every ask
// that got one. The runner's loop is the SDK's, unchanged: only its tools are
// the ones pgonceanthropic.Executor.RunnerTools returns.
//
// The model is a fake that speaks the Messages API (an httptest server), and
// so is the payments API, which honours Idempotency-Key as Stripe's does;
// PostgreSQL is real. Run it with a database:
//
//	PGONCE_DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable go run ./examples/refund
//
// It migrates a schema of its own and drops it at the end.
package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/anthropics/anthropic-sdk-go/v2/toolrunner"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgonce/pgonce/agents/pgonceanthropic"
	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/migrations"
	"github.com/pgonce/pgonce/outbox"
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
	ai := anthropic.NewClient(option.WithBaseURL(model.URL), option.WithAPIKey("sk-ant-example"), option.WithMaxRetries(0))

	// The runner's refund tool, as its users write it: it calls the
	// payments API with the action's key as its Idempotency-Key.
	refund := toolrunner.NewBetaTool("refund", "Refunds an order.", anthropic.BetaToolInputSchemaParam{
		Properties: map[string]any{"order": map[string]any{"type": "integer"}, "amount": map[string]any{"type": "string"}},
	}, func(ctx context.Context, input json.RawMessage) (anthropic.BetaToolResultBlockParamContentUnion, error) {
		req, ok := toolcall.RequestFromContext(ctx)
		if !ok {
			return anthropic.BetaToolResultBlockParamContentUnion{}, errors.New("refund runs through pgonce")
		}
		answer, err := payments.refund(ctx, string(req.Key), input)
		if err != nil {
			return anthropic.BetaToolResultBlockParamContentUnion{}, outbox.Ambiguous(err) // it may have refunded
		}
		return anthropic.BetaToolResultBlockParamContentUnion{OfText: &anthropic.BetaTextBlockParam{Text: "refunded: " + answer}}, nil
	})

	// A worker is a process of the runtime: its own pgonce client over the
	// same schema, with the tool registered. Its crash hook, when set, runs
	// after the payments API answered and before anything is recorded.
	newWorker := func(crash outbox.Middleware) (*outbox.Client[pgx.Tx], *pgonceanthropic.Executor[pgx.Tx], error) {
		registry := outbox.NewRegistry()
		if err := registry.Register("refund", pgonceanthropic.Provider(refund), outbox.IdempotentByKey); err != nil {
			return nil, nil, err
		}
		config := outbox.Config{Schema: schema, Registry: registry, Logger: slog.New(slog.DiscardHandler)}
		if crash != nil {
			// The shortest lease its call timeout allows, so that the
			// crashed attempt expires in about a second and a half.
			config.Middleware = []outbox.Middleware{crash}
			config.CallTimeout = 500 * time.Millisecond
			config.Lease = config.CallTimeout + outbox.LeaseMarginMin
		}
		client, err := outbox.NewPgx(pool, config)
		if err != nil {
			return nil, nil, err
		}
		exec, err := pgonceanthropic.New(client, toolcall.Config{Wait: 30 * time.Second})
		return client, exec, err
	}

	// runTurn is one delivery of the job that runs the turn: the SDK's tool
	// runner, over the conversation as the runtime persisted it before the
	// turn, with the tools made exactly-once.
	runTurn := func(ctx context.Context, exec *pgonceanthropic.Executor[pgx.Tx]) error {
		var runner *anthropic.BetaToolRunner
		tools, err := exec.RunnerTools(pgonceanthropic.RunnerConfig{
			RunID:    "run-8842",
			Messages: func() []anthropic.BetaMessageParam { return runner.Messages() },
		}, refund)
		if err != nil {
			return err
		}
		runner = ai.Beta.Messages.NewToolRunner(tools, anthropic.BetaToolRunnerParams{
			BetaMessageNewParams: anthropic.BetaMessageNewParams{
				Model: "claude-example", MaxTokens: 1024,
				System:   []anthropic.BetaTextBlockParam{{Text: "You handle refunds."}},
				Messages: []anthropic.BetaMessageParam{anthropic.NewBetaUserMessage(anthropic.NewBetaTextBlock("Please refund the 42.00 I paid for order 8842."))},
			},
			DisableThread: true,
		}, pgonceanthropic.RunnerOptions(nil)...) // each call knows its tool_use block
		_, err = runner.RunToCompletion(ctx)
		return err
	}

	say("1. Worker A runs the turn: the model calls a tool, and the runner runs it.")
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
	_, execA, err := newWorker(crash)
	if err != nil {
		return err
	}
	go func() { _ = runTurn(context.WithoutCancel(ctx), execA) }()
	select {
	case <-crashed:
	case <-ctx.Done():
		return ctx.Err()
	}
	say("   the model:        %s", model.lastCall())
	say("   the payments API: %d refund; worker A crashes before it records anything.", payments.refunds())

	say("2. The job is delivered again, to worker B, which runs a dispatcher as every")
	say("   worker does. The model calls the tool again; pgonce finds it in flight and")
	say("   waits. A's lease expires, B's dispatcher reconciles it and retries it with")
	say("   the same key: the payments API answers the same refund.")
	clientB, execB, err := newWorker(nil)
	if err != nil {
		return err
	}
	disp, err := dispatcher.New(clientB, dispatcher.Config{
		MaintenanceInterval: 50 * time.Millisecond,
		Reconcile:           dispatcher.ReconcileConfig{Grace: time.Millisecond, PruneDisabled: true},
	})
	if err != nil {
		return err
	}
	dispCtx, stopDispatcher := context.WithCancel(ctx)
	dispDone := make(chan error, 1)
	go func() { dispDone <- disp.Run(dispCtx) }()
	err = runTurn(ctx, execB)
	stopDispatcher()
	if err := errors.Join(err, <-dispDone); err != nil {
		return err
	}
	first := model.lastRead()
	say("   the model:        %s", model.lastCall())
	say("   the model reads:  %s", first)

	say("3. B dies before it persists the turn; worker C runs it again.")
	_, execC, err := newWorker(nil)
	if err != nil {
		return err
	}
	if err := runTurn(ctx, execC); err != nil {
		return err
	}
	again := model.lastRead()
	say("   the model:        %s", model.lastCall())
	say("   the model reads:  %s", again)

	say("")
	say("refunds made by the payments API:  %d", payments.refunds())
	say("the same tool result on each ask:  %t", first == again)
	if payments.refunds() != 1 || first != again || !strings.Contains(first, "re_1") {
		return fmt.Errorf("one refund and one tool result expected, got %d refunds and %q, %q", payments.refunds(), first, again)
	}
	return nil
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

// refund asks the payments API to refund, under key.
func (p *payments) refund(ctx context.Context, key string, body []byte) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.URL+"/v1/refunds", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := p.Client().Do(req)
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	answer, err := io.ReadAll(resp.Body)
	return string(answer), err
}

func (p *payments) refunds() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.answers)
}

// model is a fake model that speaks the Messages API: it calls refund, each
// time with a new tool_use id, from the third ask on with the input's members
// in another order; given the tool's result, it ends its turn.
type model struct {
	*httptest.Server
	mu    sync.Mutex
	asks  int
	calls []string
	reads []string
}

func newModel() *model {
	m := &model{}
	m.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var request struct {
			Messages []struct {
				Content json.RawMessage `json:"content"`
			} `json:"messages"`
		}
		_ = json.NewDecoder(r.Body).Decode(&request)
		m.mu.Lock()
		defer m.mu.Unlock()
		content, stop := "", "tool_use"
		if n := len(request.Messages); n > 1 {
			m.reads = append(m.reads, toolResultText(request.Messages[n-1].Content))
			content, stop = `[{"type":"text","text":"Your refund is done."}]`, "end_turn"
		} else {
			m.asks++
			id := fmt.Sprintf("toolu_%c1", 'A'+m.asks-1)
			input := `{"order": 8842, "amount": "42.00"}`
			if m.asks >= 3 {
				input = `{"amount": "42.00", "order": 8842}`
			}
			m.calls = append(m.calls, fmt.Sprintf("refund(%s), id %s", input, id))
			content = `[{"type":"tool_use","id":"` + id + `","name":"refund","input":` + input + `}]`
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"msg_example","type":"message","role":"assistant","model":"claude-example",
			"content":`+content+`,"stop_reason":"`+stop+`","stop_sequence":null,"usage":{"input_tokens":1,"output_tokens":1}}`)
	}))
	return m
}

// toolResultText returns the text of the tool_result of a user message's
// content.
func toolResultText(content json.RawMessage) string {
	var blocks []struct {
		Type    string `json:"type"`
		IsError bool   `json:"is_error"`
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	}
	if err := json.Unmarshal(content, &blocks); err != nil || len(blocks) == 0 || blocks[0].Type != "tool_result" {
		return "(no tool result)"
	}
	var text strings.Builder
	if blocks[0].IsError {
		text.WriteString("(is_error) ")
	}
	for _, c := range blocks[0].Content {
		text.WriteString(c.Text)
	}
	return text.String()
}

func (m *model) lastCall() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls[len(m.calls)-1]
}

func (m *model) lastRead() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.reads) == 0 {
		return "(nothing)"
	}
	return m.reads[len(m.reads)-1]
}
