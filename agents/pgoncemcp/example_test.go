package pgoncemcp_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pgonce/pgonce/agents/pgoncemcp"
	"github.com/pgonce/pgonce/migrations"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/toolcall"
)

// Example runs an agent and an MCP server, both with pgonce: the server's
// refund tool is guarded, and the agent's calls of it go through a caller.
// The model asks for the refund twice, the second time with the members
// re-ordered: the agent sends it once, the server runs it once, and the
// agent gets the same result both times.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, cmp.Or(os.Getenv("PGONCE_TEST_DATABASE_URL"), databaseURLDefault))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer func() { _ = db.Close() }()
	// The server and the agent keep their keys each in a schema of its own.
	newClient := func() *outbox.Client[pgx.Tx] {
		schema := "example_" + strings.ToLower(rand.Text())
		if err := migrations.Up(ctx, db, schema); err != nil {
			panic(err)
		}
		client, err := outbox.NewPgx(pool, outbox.Config{Schema: schema, Registry: outbox.NewRegistry()})
		if err != nil {
			panic(err)
		}
		return client
	}
	serverClient, agentClient := newClient(), newClient()
	defer func() {
		for _, c := range []*outbox.Client[pgx.Tx]{serverClient, agentClient} {
			_, _ = db.ExecContext(context.WithoutCancel(ctx), `DROP SCHEMA "`+c.Config().Schema+`" CASCADE`)
		}
	}()

	// The server: its refund tool, guarded.
	guard, err := pgoncemcp.NewGuard(serverClient, pgoncemcp.ServerConfig{})
	if err != nil {
		panic(err)
	}
	server := mcp.NewServer(&mcp.Implementation{Name: "payments", Version: "1.0.0"}, nil)
	server.AddReceivingMiddleware(guard.Middleware)
	runs := 0
	type refundIn struct {
		Order  int64  `json:"order"`
		Amount string `json:"amount"`
	}
	if err := pgoncemcp.AddTool(server, guard, &mcp.Tool{Name: "refund", Description: "Refunds an order."}, outbox.IdempotentByKey,
		func(ctx context.Context, _ *mcp.CallToolRequest, in refundIn) (*mcp.CallToolResult, any, error) {
			runs++
			// Here the payments API would be called with the action's key,
			// toolcall.RequestFromContext(ctx).Key, as its Idempotency-Key.
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("refunded %s on order %d: re_1", in.Amount, in.Order)}}}, nil, nil
		}); err != nil {
		panic(err)
	}

	// The agent: its calls of refund through a caller.
	caller, err := pgoncemcp.NewCaller(agentClient, pgoncemcp.ClientConfig{})
	if err != nil {
		panic(err)
	}
	if err := caller.Register("refund", outbox.IdempotentByKey); err != nil {
		panic(err)
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1.0.0"}, nil)
	client.AddSendingMiddleware(caller.Middleware)
	serverTransport, clientTransport := mcp.NewInMemoryTransports()
	serverSession, err := server.Connect(ctx, serverTransport, nil)
	if err != nil {
		panic(err)
	}
	session, err := client.Connect(ctx, clientTransport, nil)
	if err != nil {
		panic(err)
	}
	defer func() {
		_ = session.Close()
		_ = serverSession.Wait()
	}()

	turn := toolcall.Turn{RunID: "run-8842"}
	for _, args := range []string{`{"order": 8842, "amount": "42.00"}`, `{"amount": "42.00", "order": 8842}`} {
		res, err := session.CallTool(ctx, pgoncemcp.CallParams(turn.Call(0, "call_1", "refund", args)))
		if err != nil {
			panic(err)
		}
		fmt.Println(res.Content[0].(*mcp.TextContent).Text)
	}
	fmt.Println("the tool ran:", runs)
	// Output:
	// refunded 42.00 on order 8842: re_1
	// refunded 42.00 on order 8842: re_1
	// the tool ran: 1
}
