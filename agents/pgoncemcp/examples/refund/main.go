// Command refund tells pgonce's refund story over the Model Context
// Protocol, offline: an agent's model asks for refund(order=8842,
// amount="42.00"), a tool of a payments MCP server; the agent crashes after
// the server refunded; the job is delivered again while the crashed claim
// holds; the restarted agent runs the turn again, the model writing the call
// with its members re-ordered. One refund, the server's tool run once, and the
// same tool result for the model on every ask that got one.
//
// Both sides run pgonce: the server guards its refund tool
// (pgoncemcp.Guard), and the agent sends its calls through a
// pgoncemcp.Caller, which names each call by the key it derives. The model
// is a script; the MCP session runs over in-memory transports; PostgreSQL is
// real. Run it with a database:
//
//	PGONCE_DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable go run ./examples/refund
//
// It migrates two schemas of its own, the server's and the agent's, and drops
// them at the end.
package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pgonce/pgonce/agents/pgoncemcp"
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
	db := stdlib.OpenDBFromPool(pool)
	defer func() { _ = db.Close() }()
	var schemas []string
	defer func() {
		for _, schema := range schemas {
			_, _ = pool.Exec(context.WithoutCancel(ctx), `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		}
	}()
	newSchema := func() (string, error) {
		schema := "refund_example_" + strings.ToLower(rand.Text())
		schemas = append(schemas, schema)
		return schema, migrations.Up(ctx, db, schema)
	}
	quiet := slog.New(slog.DiscardHandler)

	// The payments server: its refund tool, guarded, refunds once per key
	// (as a payments API that honours Idempotency-Key would: the guard is
	// what stands between its tool and a second refund).
	serverSchema, err := newSchema()
	if err != nil {
		return err
	}
	serverClient, err := outbox.NewPgx(pool, outbox.Config{Schema: serverSchema, Registry: outbox.NewRegistry(), Logger: quiet})
	if err != nil {
		return err
	}
	guard, err := pgoncemcp.NewGuard(serverClient, pgoncemcp.ServerConfig{})
	if err != nil {
		return err
	}
	server := mcp.NewServer(&mcp.Implementation{Name: "payments", Version: "1.0.0"}, nil)
	server.AddReceivingMiddleware(guard.Middleware)
	var refunds, toolRuns atomic.Int64
	type refundIn struct {
		Order  int64  `json:"order"`
		Amount string `json:"amount"`
	}
	if err := pgoncemcp.AddTool(server, guard, &mcp.Tool{Name: "refund", Description: "Refunds an order."}, outbox.IdempotentByKey,
		func(ctx context.Context, _ *mcp.CallToolRequest, in refundIn) (*mcp.CallToolResult, any, error) {
			toolRuns.Add(1)
			id := refunds.Add(1)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{
				Text: fmt.Sprintf(`{"refund_id": "re_%d", "order": %d, "amount": %q}`, id, in.Order, in.Amount),
			}}}, nil, nil
		}); err != nil {
		return err
	}

	// An agent process: its own pgonce client over the agent's schema, a
	// caller that registers the server's refund tool, and an MCP session.
	// Its crash hook, when set, runs after the server answered and before
	// anything is recorded.
	agentSchema, err := newSchema()
	if err != nil {
		return err
	}
	var sessions []*mcp.ClientSession
	defer func() {
		for _, s := range sessions {
			_ = s.Close()
		}
	}()
	newAgent := func(crash outbox.Middleware) (*outbox.Client[pgx.Tx], *mcp.ClientSession, error) {
		config := outbox.Config{Schema: agentSchema, Registry: outbox.NewRegistry(), Logger: quiet}
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
		caller, err := pgoncemcp.NewCaller(client, pgoncemcp.ClientConfig{})
		if err != nil {
			return nil, nil, err
		}
		// The server honours the key: exactly once end to end.
		if err := caller.Register("refund", outbox.IdempotentByKey); err != nil {
			return nil, nil, err
		}
		mcpClient := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1.0.0"}, nil)
		mcpClient.AddSendingMiddleware(caller.Middleware)
		serverTransport, clientTransport := mcp.NewInMemoryTransports()
		if _, err := server.Connect(ctx, serverTransport, nil); err != nil {
			return nil, nil, err
		}
		session, err := mcpClient.Connect(ctx, clientTransport, nil)
		if err != nil {
			return nil, nil, err
		}
		sessions = append(sessions, session)
		return client, session, nil
	}

	// The model, scripted: each ask of the turn, it calls refund with a new
	// call id; from the third ask on, the arguments' members are re-ordered.
	var (
		modelMu sync.Mutex
		asks    int
		asked   toolcall.Call // the model's last call
	)
	model := func() toolcall.Call {
		modelMu.Lock()
		defer modelMu.Unlock()
		asks++
		args := `{"order": 8842, "amount": "42.00"}`
		if asks >= 3 {
			args = `{"amount": "42.00", "order": 8842}`
		}
		// The turn's first call; the run made none before it.
		asked = toolcall.Turn{RunID: "run-8842"}.Call(0, fmt.Sprintf("call_%c1", 'A'+asks-1), "refund", args)
		return asked
	}
	lastCall := func() toolcall.Call {
		modelMu.Lock()
		defer modelMu.Unlock()
		return asked
	}
	ask := func(ctx context.Context, session *mcp.ClientSession) (toolcall.Call, *mcp.CallToolResult, error) {
		call := model()
		res, err := session.CallTool(ctx, pgoncemcp.CallParams(call))
		return call, res, err
	}
	describe := func(call toolcall.Call) string {
		return fmt.Sprintf("%s(%s), id %s", call.Tool, call.Arguments, call.ID)
	}
	resultText := func(res *mcp.CallToolResult) string {
		var b strings.Builder
		for _, c := range res.Content {
			if text, ok := c.(*mcp.TextContent); ok {
				b.WriteString(text.Text)
			}
		}
		return b.String()
	}

	say("1. Agent A asks the model, which calls the server's refund tool; A sends it.")
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
	_, sessionA, err := newAgent(crash)
	if err != nil {
		return err
	}
	go func() { _, _, _ = ask(context.WithoutCancel(ctx), sessionA) }()
	select {
	case <-crashed:
	case <-ctx.Done():
		return ctx.Err()
	}
	say("   the model:        %s", describe(lastCall()))
	say("   the server:       %d refund; agent A crashes before it records anything.", refunds.Load())

	say("2. The job is delivered again, to agent B, while A's claim holds.")
	_, sessionB, err := newAgent(nil)
	if err != nil {
		return err
	}
	call, res, err := ask(ctx, sessionB)
	if err != nil {
		return err
	}
	obs, _ := pgoncemcp.ObservationOf(res)
	say("   the model:        %s", describe(call))
	say("   pgonce:           %s; nothing sent, B hands the model nothing and tries later.", obs.Status)
	if obs.Status != outbox.ObservationInProgress {
		return fmt.Errorf("agent B must find the refund in progress, got %q", resultText(res))
	}

	say("3. The agent restarts as C: A's lease expires, the reconciler puts the call")
	say("   back to pending, and C asks the model again. C sends the call with the")
	say("   same key; the server's guard answers with the result it stored.")
	clientC, sessionC, err := newAgent(nil)
	if err != nil {
		return err
	}
	if err := reconcileUntilResolved(ctx, clientC); err != nil {
		return err
	}
	call, res, err = ask(ctx, sessionC)
	if err != nil {
		return err
	}
	first := resultText(res)
	say("   the model:        %s", describe(call))
	say("   the tool result:  %s", first)

	say("4. C dies before it persists the turn; agent D runs it again.")
	_, sessionD, err := newAgent(nil)
	if err != nil {
		return err
	}
	call, res, err = ask(ctx, sessionD)
	if err != nil {
		return err
	}
	again := resultText(res)
	say("   the model:        %s", describe(call))
	say("   the tool result:  %s", again)

	say("")
	say("refunds made by the server:        %d (its tool ran %d time)", refunds.Load(), toolRuns.Load())
	say("the same tool result on each ask:  %t", first == again)
	if refunds.Load() != 1 || first != again || !strings.Contains(first, "re_1") {
		return fmt.Errorf("one refund and one tool result expected, got %d refunds and %q, %q", refunds.Load(), first, again)
	}
	return nil
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
