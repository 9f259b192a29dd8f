package pgoncemcp_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/agents/pgoncemcp"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/toolcall"
)

// refundIn and refundOut are the refund tool's input and output.
type refundIn struct {
	Order  int64  `json:"order"`
	Amount string `json:"amount,omitempty"`
}

type refundOut struct {
	RefundID string `json:"refund_id"`
	Order    int64  `json:"order"`
	Amount   string `json:"amount"`
}

// server is an MCP server whose refund tool refunds through the ledger,
// guarded; its lookup tool is read-only. It counts the handlers' runs, keeps
// the keys its refund handler ran for, and keeps the results it writes on
// the wire. The refund tool honours keys, so a run again with a key is a
// legitimate retry (an attempt past its call timeout on a busy machine): a
// test counts the keys acted on, and runs only where none may happen.
type server struct {
	*mcp.Server
	guard   *pgoncemcp.Guard[pgx.Tx]
	refunds atomic.Int64 // refund handler runs
	keys    sync.Map     // outbox.Key → struct{}: keys the refund handler ran for
	lookups atomic.Int64 // lookup handler runs
	calls   atomic.Int64 // tools/call requests received
	wire    *wireLog
	// hold, when set, runs in the refund handler before it refunds.
	hold func(ctx context.Context) error
	// fail, when set, is the refund handler's error.
	fail error
	// after, when set, runs in the refund handler after it refunded.
	after func(ctx context.Context) error
}

func newServer(t *testing.T, l *ledger, client *outbox.Client[pgx.Tx], config pgoncemcp.ServerConfig, delivery outbox.Delivery) *server {
	t.Helper()
	guard, err := pgoncemcp.NewGuard(client, config)
	require.NoError(t, err)
	s := &server{Server: mcp.NewServer(&mcp.Implementation{Name: "payments", Version: "1.0.0"}, nil), guard: guard, wire: &wireLog{}}
	s.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method == "tools/call" {
				s.calls.Add(1)
			}
			return next(ctx, method, req)
		}
	}, guard.Middleware)
	require.NoError(t, pgoncemcp.AddTool(s.Server, guard, &mcp.Tool{Name: "refund", Description: "Refunds an order."}, delivery,
		func(ctx context.Context, _ *mcp.CallToolRequest, in refundIn) (*mcp.CallToolResult, refundOut, error) {
			s.refunds.Add(1)
			if req, ok := toolcall.RequestFromContext(ctx); ok {
				s.keys.Store(req.Key, struct{}{})
			}
			if s.hold != nil {
				if err := s.hold(ctx); err != nil {
					return nil, refundOut{}, err
				}
			}
			if s.fail != nil {
				return nil, refundOut{}, s.fail
			}
			req, ok := toolcall.RequestFromContext(ctx) // the key, for the ledger
			if !ok {
				return nil, refundOut{}, errors.New("no pgonce request")
			}
			resp, err := l.Call(ctx, req)
			if err != nil {
				return nil, refundOut{}, err
			}
			if s.after != nil {
				if err := s.after(ctx); err != nil {
					return nil, refundOut{}, err
				}
			}
			var out refundOut
			err = json.Unmarshal(resp, &out)
			return nil, out, err
		}))
	require.NoError(t, pgoncemcp.AddTool(s.Server, guard,
		&mcp.Tool{Name: "lookup", Description: "Looks an order up.", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, outbox.AtMostOnce,
		func(ctx context.Context, _ *mcp.CallToolRequest, in refundIn) (*mcp.CallToolResult, any, error) {
			s.lookups.Add(1)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "order 8842: paid"}}}, nil, nil
		}))
	return s
}

// actedOn returns how many distinct keys the refund handler ran for: the
// actions it took, however many times a legitimate retry ran each.
func (s *server) actedOn() int {
	n := 0
	s.keys.Range(func(any, any) bool {
		n++
		return true
	})
	return n
}

// connect connects a client to s, with the given sending middleware, and
// returns its session.
func connect(t *testing.T, s *server, middleware ...mcp.Middleware) *mcp.ClientSession {
	t.Helper()
	serverTransport, clientTransport := mcp.NewInMemoryTransports()
	ss, err := s.Connect(t.Context(), &mcp.LoggingTransport{Transport: serverTransport, Writer: s.wire}, nil)
	require.NoError(t, err)
	client := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1.0.0"}, nil)
	client.AddSendingMiddleware(middleware...)
	cs, err := client.Connect(t.Context(), clientTransport, nil)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = cs.Close()
		_ = ss.Wait()
	})
	return cs
}

// wireLog keeps what a server's logging transport writes.
type wireLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (w *wireLog) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

// results returns the results of the server's n first responses to tool
// calls, as the bytes it wrote, in order. It waits for them: the transport
// logs a response after the client may have read it.
func (w *wireLog) results(t *testing.T, n int) []string {
	t.Helper()
	for {
		if out := w.read(t); len(out) >= n {
			return out[:n]
		}
		select {
		case <-t.Context().Done():
			t.Fatalf("the server never wrote %d results", n)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (w *wireLog) read(t *testing.T) []string {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	scanner := bufio.NewScanner(bytes.NewReader(w.buf.Bytes()))
	scanner.Buffer(nil, 1<<20)
	for scanner.Scan() {
		line, ok := strings.CutPrefix(scanner.Text(), "write: ")
		if !ok {
			continue
		}
		var msg struct {
			Result json.RawMessage `json:"result"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &msg))
		if bytes.Contains(msg.Result, []byte(`"content"`)) {
			out = append(out, string(msg.Result))
		}
	}
	return out
}

// text returns the text of a result's content.
func text(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	var b strings.Builder
	for _, c := range res.Content {
		tc, ok := c.(*mcp.TextContent)
		require.True(t, ok, "content %T", c)
		b.WriteString(tc.Text)
	}
	return b.String()
}

// refundParams are the parameters of a refund call at step 3 of run-1.
func refundParams(args string) *mcp.CallToolParams {
	return &mcp.CallToolParams{Name: "refund", Arguments: json.RawMessage(args), Meta: pgoncemcp.StepMeta("run-1", 3)}
}

// requireReplayOf requires replay, a result as the server wrote it, to be
// first's replay: every member the same bytes, _meta included, but for
// pgonce's mark, which says replayed where first's did not.
func requireReplayOf(t *testing.T, first, replay string) {
	t.Helper()
	members := func(doc json.RawMessage) map[string]json.RawMessage {
		var m map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(doc, &m))
		return m
	}
	a, b := members(json.RawMessage(first)), members(json.RawMessage(replay))
	require.Contains(t, a, "_meta")
	require.Contains(t, b, "_meta")
	metaA, metaB := members(a["_meta"]), members(b["_meta"])
	delete(a, "_meta")
	delete(b, "_meta")
	require.Equal(t, a, b, "the same content, byte for byte")
	var markA, markB pgoncemcp.ActionMark
	require.NoError(t, json.Unmarshal(metaA[pgoncemcp.MetaAction], &markA))
	require.NoError(t, json.Unmarshal(metaB[pgoncemcp.MetaAction], &markB))
	require.Equal(t, pgoncemcp.ActionMark{Key: markA.Key, Replayed: false}, markA, "the first answer is not a replay")
	require.Equal(t, pgoncemcp.ActionMark{Key: markA.Key, Replayed: true}, markB, "the second is")
	require.Regexp(t, `^k1_[0-9a-f]{64}$`, string(markA.Key))
	delete(metaA, pgoncemcp.MetaAction)
	delete(metaB, pgoncemcp.MetaAction)
	require.Equal(t, metaA, metaB, "the same _meta but the mark")
}
