package proxy_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/agents/pgoncemcp"
	"github.com/pgonce/pgonce/agents/pgoncemcp/proxy"
	"github.com/pgonce/pgonce/outbox"
)

// seen is what an HTTP upstream of the test's own saw of each call: the
// Authorization header and the key in _meta.
type seen struct {
	mu    sync.Mutex
	auth  []string
	keys  []string
	calls int
	// rejected counts the calls of "reject", which answers a JSON-RPC
	// error.
	rejected int
}

// httpUpstream serves a tool "notify" over streamable HTTP and records what
// each call carried. It checks the headers and the _meta the proxy sends,
// which no npm server reports.
func httpUpstream(t *testing.T) (*httptest.Server, *seen) {
	t.Helper()
	s := &seen{}
	server := mcp.NewServer(&mcp.Implementation{Name: "notifier", Version: "1"}, nil)
	server.AddTool(&mcp.Tool{Name: "notify", InputSchema: map[string]any{"type": "object"}},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.calls++
			s.auth = append(s.auth, req.Extra.Header.Get("Authorization"))
			key, _ := req.Params.Meta[pgoncemcp.MetaKey].(string)
			s.keys = append(s.keys, key)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "sent"}}}, nil
		})
	server.AddTool(&mcp.Tool{Name: "reject", InputSchema: map[string]any{"type": "object"}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.rejected++
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "no such order: 8842"}
		})
	ts := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil))
	t.Cleanup(ts.Close)
	return ts, s
}

// bearer sets an Authorization header on every request.
type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// syncBuffer is a log destination that handlers write to from many
// goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestProxyOverHTTP(t *testing.T) {
	t.Parallel()

	setup := func(t *testing.T, level slog.Level) (session *mcp.ClientSession, upstream *seen, log *syncBuffer) {
		t.Helper()
		ts, s := httpUpstream(t)
		log = &syncBuffer{}
		schema := newSchema(t)
		config := proxy.Config{Upstream: proxy.Upstream{URL: ts.URL}, Schema: schema}
		client, err := outbox.NewPgx(testPool(t), config.OutboxConfig())
		require.NoError(t, err)
		p, err := proxy.New(t.Context(), client, config, &proxy.Opts{
			Logger: slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: level})),
		})
		require.NoError(t, err)
		t.Cleanup(func() { _ = p.Close() })
		front := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return p.Server() }, nil))
		t.Cleanup(front.Close)
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).Connect(t.Context(),
			&mcp.StreamableClientTransport{Endpoint: front.URL, HTTPClient: &http.Client{Transport: bearer{"s3cret-token"}}}, nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = cs.Close() })
		return cs, s, log
	}
	const args = `{"to":"ada@example.com","body":"private-body-text"}`

	t.Run("TheClientsAuthorizationAndTheKeyGoDownstream", func(t *testing.T) {
		t.Parallel()
		cs, upstream, _ := setup(t, slog.LevelInfo)
		for range 2 {
			res, err := cs.CallTool(t.Context(), call("notify", "run-1", 1, args))
			require.NoError(t, err)
			require.False(t, res.IsError, text(res))
		}
		upstream.mu.Lock()
		defer upstream.mu.Unlock()
		require.Equal(t, 1, upstream.calls, "the second call got the stored result")
		require.Equal(t, []string{"Bearer s3cret-token"}, upstream.auth)
		require.Equal(t, []string{string(keyOf(t, "notify", "run-1", 1, args))}, upstream.keys)
	})

	t.Run("AJSONRPCErrorOfTheUpstreamComesBackAsItIsAndRecordsNothing", func(t *testing.T) {
		t.Parallel()
		cs, upstream, _ := setup(t, slog.LevelInfo)
		for range 2 {
			_, err := cs.CallTool(t.Context(), call("reject", "run-1", 1, args))
			var wire *jsonrpc.Error
			require.ErrorAs(t, err, &wire)
			require.Equal(t, int64(jsonrpc.CodeInvalidParams), wire.Code)
			require.Equal(t, "no such order: 8842", wire.Message)
		}
		upstream.mu.Lock()
		defer upstream.mu.Unlock()
		require.Equal(t, 2, upstream.rejected, "the upstream ran nothing, so the action is asked again")
	})

	t.Run("NeverLogsCredentialsOrArgumentsAboveDebug", func(t *testing.T) {
		t.Parallel()
		for _, tt := range []struct {
			level     slog.Level
			arguments bool
		}{{slog.LevelInfo, false}, {slog.LevelDebug, true}} {
			cs, _, log := setup(t, tt.level)
			res, err := cs.CallTool(t.Context(), call("notify", "run-1", 1, args))
			require.NoError(t, err)
			require.False(t, res.IsError, text(res))
			require.Contains(t, log.String(), "notify", "the call is logged")
			require.NotContains(t, log.String(), "s3cret")
			if tt.arguments {
				require.Contains(t, log.String(), "private-body-text")
			} else {
				require.NotContains(t, log.String(), "private-body-text")
			}
		}
	})
}
