package pgoncemcp_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/agents/pgoncemcp"
	"github.com/pgonce/pgonce/oncetest"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/toolcall"
)

// agent is the agent's side: a schema of its own, a client over it and a
// caller that registers the server's refund tool.
type agent struct {
	schema string
	client *outbox.Client[pgx.Tx]
	caller *pgoncemcp.Caller[pgx.Tx]
}

func newAgent(t *testing.T, schema string, delivery outbox.Delivery, config outbox.Config) *agent {
	t.Helper()
	if schema == "" {
		schema = oncetest.SchemaPgx(t, testPool(t))
	}
	client := newClient(t, schema, config)
	caller, err := pgoncemcp.NewCaller(client, pgoncemcp.ClientConfig{})
	require.NoError(t, err)
	require.NoError(t, caller.Register("refund", delivery))
	return &agent{schema: schema, client: client, caller: caller}
}

// seen records the _meta of the tools/call requests a server receives.
func seen(s *server) func() []mcp.Meta {
	var mu sync.Mutex
	var metas []mcp.Meta
	s.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if call, ok := req.(*mcp.CallToolRequest); ok && method == "tools/call" {
				mu.Lock()
				metas = append(metas, call.Params.Meta)
				mu.Unlock()
			}
			return next(ctx, method, req)
		}
	})
	return func() []mcp.Meta {
		mu.Lock()
		defer mu.Unlock()
		return append([]mcp.Meta(nil), metas...)
	}
}

// loseResponse is a sending middleware, inside the caller's, that loses the
// response of the first tools/call after the server got it: the connection
// dropped on the way back.
func loseResponse() mcp.Middleware {
	var once sync.Once
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			res, err := next(ctx, method, req)
			lost := false
			if method == "tools/call" {
				once.Do(func() { lost = true })
			}
			if lost {
				return nil, errors.New("connection reset by peer")
			}
			return res, err
		}
	}
}

func TestCaller(t *testing.T) {
	t.Parallel()

	t.Run("ExactlyOnceEndToEnd", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		s := newServer(t, b.ledger, b.client, pgoncemcp.ServerConfig{}, outbox.IdempotentByKey)
		metas := seen(s)
		a := newAgent(t, "", outbox.IdempotentByKey, outbox.Config{})
		cs := connect(t, s, a.caller.Middleware)

		// The model's tool call, forwarded to the server, twice: the second
		// time with another id and the members re-ordered.
		turn := toolcall.Turn{RunID: "run-1", FirstStep: 3}
		first, err := cs.CallTool(t.Context(), pgoncemcp.CallParams(turn.Call(0, "call_1", "refund", `{"order": 8842, "amount": "42.00"}`)))
		require.NoError(t, err)
		again, err := cs.CallTool(t.Context(), pgoncemcp.CallParams(turn.Call(0, "call_2", "refund", `{"amount":"42.00","order":8842}`)))
		require.NoError(t, err)
		require.False(t, first.IsError, text(t, first))
		require.Equal(t, 1, b.ledger.refunds(t))
		// The agent reads the same result, the caller's mark aside: its key,
		// and whether the caller replayed it.
		key := keyOf(t, "run-1", 3, `{"order":8842,"amount":"42.00"}`)
		firstMark, ok := pgoncemcp.ActionMarkOf(first)
		require.True(t, ok)
		require.Equal(t, pgoncemcp.ActionMark{Key: key}, firstMark)
		againMark, ok := pgoncemcp.ActionMarkOf(again)
		require.True(t, ok)
		require.Equal(t, pgoncemcp.ActionMark{Key: key, Replayed: true}, againMark)
		first.Meta[pgoncemcp.MetaAction], again.Meta[pgoncemcp.MetaAction] = nil, nil
		require.Equal(t, mustJSON(t, first), mustJSON(t, again))

		// The server got one call, which named the action by the agent's key.
		require.Len(t, metas(), 1)
		meta := metas()[0]
		require.Equal(t, string(keyOf(t, "run-1", 3, `{"order":8842,"amount":"42.00"}`)), meta[pgoncemcp.MetaKey])
		require.NotContains(t, meta, pgoncemcp.MetaRunID)
		require.NotContains(t, meta, pgoncemcp.MetaStep)
	})

	t.Run("TheServerHonoursTheKeyAfterTheAgentCrashed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		s := newServer(t, b.ledger, b.client, pgoncemcp.ServerConfig{}, outbox.IdempotentByKey)
		metas := seen(s)
		agentSchema := oncetest.SchemaPgx(t, testPool(t))

		// Agent A sends the call; the server refunds and answers; A dies
		// before it records anything.
		dead, acted := make(chan struct{}), make(chan struct{})
		var once sync.Once
		crashed := newAgent(t, agentSchema, outbox.IdempotentByKey, outbox.Config{
			CallTimeout: 50 * time.Millisecond, Lease: 50*time.Millisecond + outbox.LeaseMarginMin,
			Middleware: []outbox.Middleware{outbox.MiddlewareFunc(func(ctx context.Context, call *outbox.ProviderCall, next func(context.Context) outbox.ProviderResult) outbox.ProviderResult {
				res := next(ctx)
				once.Do(func() { close(acted) })
				<-dead
				return res
			})},
		})
		crashedSession := connect(t, s, crashed.caller.Middleware)
		t.Cleanup(func() { close(dead) }) // before the session closes
		go func() {
			_, _ = crashedSession.CallTool(context.WithoutCancel(t.Context()), &mcp.CallToolParams{
				Name: "refund", Arguments: map[string]any{"order": 8842, "amount": "42.00"}, Meta: pgoncemcp.StepMeta("run-1", 3),
			})
		}()
		<-acted

		// Agent B, restarted over the same schema, asks again.
		restarted := newAgent(t, agentSchema, outbox.IdempotentByKey, outbox.Config{})
		cs := connect(t, s, restarted.caller.Middleware)
		call := &mcp.CallToolParams{Name: "refund", Arguments: map[string]any{"amount": "42.00", "order": 8842}, Meta: pgoncemcp.StepMeta("run-1", 3)}
		res, err := cs.CallTool(t.Context(), call)
		require.NoError(t, err)
		obs, ok := pgoncemcp.ObservationOf(res)
		require.True(t, ok)
		require.Equal(t, outbox.ObservationInProgress, obs.Status, "on the agent's side, before its lease expires")
		require.Len(t, metas(), 1, "nothing sent")

		reconcileUntilResolved(t, restarted.client)
		res, err = cs.CallTool(t.Context(), call)
		require.NoError(t, err)
		require.False(t, res.IsError, text(t, res))
		require.JSONEq(t, `{"refund_id":"re_1","order":8842,"amount":"42.00"}`, string(mustJSON(t, res.StructuredContent)))
		require.Len(t, metas(), 2, "sent again, with the same key")
		require.Equal(t, metas()[0][pgoncemcp.MetaKey], metas()[1][pgoncemcp.MetaKey])
		require.Equal(t, 1, b.ledger.refunds(t))
		require.Equal(t, 1, s.actedOn(), "the server acted once")
	})

	t.Run("ALostResponseIsSentAgainByKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		s := newServer(t, b.ledger, b.client, pgoncemcp.ServerConfig{}, outbox.IdempotentByKey)
		metas := seen(s)
		a := newAgent(t, "", outbox.IdempotentByKey, outbox.Config{})
		cs := connect(t, s, a.caller.Middleware, loseResponse())
		call := &mcp.CallToolParams{Name: "refund", Arguments: map[string]any{"order": 8842, "amount": "42.00"}, Meta: pgoncemcp.StepMeta("run-1", 3)}
		_, err := cs.CallTool(t.Context(), call)
		require.ErrorContains(t, err, "connection reset by peer")
		res, err := cs.CallTool(t.Context(), call)
		require.NoError(t, err)
		require.False(t, res.IsError, text(t, res))
		require.Len(t, metas(), 2)
		mark, ok := pgoncemcp.ActionMarkOf(res)
		require.True(t, ok)
		require.Equal(t, pgoncemcp.ActionMark{Key: keyOf(t, "run-1", 3, `{"order":8842,"amount":"42.00"}`), Replayed: true}, mark,
			"the server replayed what it ran for the lost response")
		require.Equal(t, 1, s.actedOn())
		require.Equal(t, 1, b.ledger.refunds(t))
	})

	t.Run("ALostResponseOfAnAtMostOnceToolGoesToReview", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		s := newServer(t, b.ledger, b.client, pgoncemcp.ServerConfig{}, outbox.IdempotentByKey)
		metas := seen(s)
		a := newAgent(t, "", outbox.AtMostOnce, outbox.Config{})
		cs := connect(t, s, a.caller.Middleware, loseResponse())
		call := &mcp.CallToolParams{Name: "refund", Arguments: map[string]any{"order": 8842, "amount": "42.00"}, Meta: pgoncemcp.StepMeta("run-1", 3)}
		_, err := cs.CallTool(t.Context(), call)
		require.ErrorContains(t, err, "connection reset by peer")
		res, err := cs.CallTool(t.Context(), call)
		require.NoError(t, err)
		obs, ok := pgoncemcp.ObservationOf(res)
		require.True(t, ok)
		require.Equal(t, outbox.ObservationNeedsReview, obs.Status, text(t, res))
		require.Len(t, metas(), 1, "never sent again")
	})

	t.Run("TheServersInProgressIsHandedBackAndAskedAgain", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		s := newServer(t, b.ledger, b.client, pgoncemcp.ServerConfig{}, outbox.IdempotentByKey)
		release, ran := make(chan struct{}), make(chan struct{})
		s.hold = func(context.Context) error { <-release; return nil } // a slow effect, past the agent's deadline
		s.after = func(context.Context) error { close(ran); return nil }
		a := newAgent(t, "", outbox.IdempotentByKey, outbox.Config{CallTimeout: 100 * time.Millisecond, Lease: 100*time.Millisecond + outbox.LeaseMarginMin})
		cs := connect(t, s, a.caller.Middleware)
		t.Cleanup(func() {
			select {
			case <-release:
			default:
				close(release)
			}
		})
		call := &mcp.CallToolParams{Name: "refund", Arguments: map[string]any{"order": 8842, "amount": "42.00"}, Meta: pgoncemcp.StepMeta("run-1", 3)}
		_, err := cs.CallTool(t.Context(), call)
		require.ErrorIs(t, err, context.DeadlineExceeded, "the agent gave up waiting")
		res, err := cs.CallTool(t.Context(), call)
		require.NoError(t, err)
		obs, ok := pgoncemcp.ObservationOf(res)
		require.True(t, ok)
		require.Equal(t, outbox.ObservationInProgress, obs.Status, "the server's: %s", text(t, res))
		close(release)
		<-ran
		for {
			res, err = cs.CallTool(t.Context(), call)
			require.NoError(t, err)
			if obs, ok := pgoncemcp.ObservationOf(res); !ok || obs.Status != outbox.ObservationInProgress {
				break
			}
			select {
			case <-t.Context().Done():
				t.Fatal("the server's action never finished")
			case <-time.After(5 * time.Millisecond):
			}
		}
		require.False(t, res.IsError, text(t, res))
		require.Equal(t, 1, s.actedOn())
		require.Equal(t, 1, b.ledger.refunds(t))
	})

	t.Run("NothingIsSentForACallWithoutActionOrWithInvalidArguments", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		s := newServer(t, b.ledger, b.client, pgoncemcp.ServerConfig{}, outbox.IdempotentByKey)
		metas := seen(s)
		a := newAgent(t, "", outbox.IdempotentByKey, outbox.Config{})
		cs := connect(t, s, a.caller.Middleware)
		_, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "refund", Arguments: map[string]any{"order": 8842}})
		require.ErrorIs(t, err, pgoncemcp.ErrNoAction)
		for _, meta := range []mcp.Meta{
			{pgoncemcp.MetaKey: strings.Repeat("k", outbox.CallStringMaxBytes+1)},
			{pgoncemcp.MetaKey: "refund\x00order-8842"},
			{pgoncemcp.MetaRunID: "run\x001", pgoncemcp.MetaStep: 3},
			{pgoncemcp.MetaRunID: "run-1", pgoncemcp.MetaStep: -1},
		} {
			_, err = cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "refund", Arguments: map[string]any{"order": 8842}, Meta: meta})
			require.ErrorIs(t, err, pgoncemcp.ErrInvalidMeta, "%v", meta)
		}
		res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "refund", Arguments: json.RawMessage(`{"order": 8842, "order": 1}`), Meta: pgoncemcp.StepMeta("run-1", 3)})
		require.NoError(t, err)
		obs, ok := pgoncemcp.ObservationOf(res)
		require.True(t, ok)
		require.Equal(t, outbox.ObservationInvalidArguments, obs.Status)
		require.Empty(t, metas())

		// A tool the agent did not register goes as it is.
		res, err = cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "lookup", Arguments: map[string]any{"order": 8842}})
		require.NoError(t, err)
		require.Equal(t, "order 8842: paid", text(t, res))
	})
}
