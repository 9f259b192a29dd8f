package proxy_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/agents/pgoncemcp/proxy"
	"github.com/pgonce/pgonce/outbox"
)

// TestProxyCallsAreKeysLikeAnyOther checks that the proxy's calls run
// through the client it is given as any inline call does: its middleware
// (telemetry's, say) sees each, with the tool's delivery, and the key is
// listed under the tool's name, as the console and the CLI list it.
func TestProxyCallsAreKeysLikeAnyOther(t *testing.T) {
	t.Parallel()
	m := newMemory(t)
	schema := newSchema(t)
	config := proxy.Config{Upstream: m.upstream, Schema: schema, Tools: map[string]proxy.Tool{"create_entities": {Delivery: proxy.DeliveryByKey}}}
	var (
		mu   sync.Mutex
		seen []outbox.ProviderCall
	)
	oc := config.OutboxConfig()
	oc.Middleware = []outbox.Middleware{outbox.MiddlewareFunc(
		func(ctx context.Context, call *outbox.ProviderCall, next func(context.Context) outbox.ProviderResult) outbox.ProviderResult {
			mu.Lock()
			seen = append(seen, *call)
			mu.Unlock()
			return next(ctx)
		})}
	client, err := outbox.NewPgx(testPool(t), oc)
	require.NoError(t, err)
	p, err := proxy.New(t.Context(), client, config, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	cs := connect(t, p.Server())

	res, err := cs.CallTool(t.Context(), call("create_entities", "run-1", 1, entity("ada")))
	require.NoError(t, err)
	require.False(t, res.IsError, text(res))
	res, err = cs.CallTool(t.Context(), call("read_graph", "run-1", 2, `{}`))
	require.NoError(t, err)
	require.False(t, res.IsError, text(res))

	mu.Lock()
	require.Len(t, seen, 1, "the read-only call is not pgonce's")
	require.Equal(t, "create_entities", seen[0].Request.Tool)
	require.Equal(t, outbox.IdempotentByKey, seen[0].Delivery)
	require.Equal(t, keyOf(t, "create_entities", "run-1", 1, entity("ada")), seen[0].Request.Key)
	mu.Unlock()

	page, err := client.List(t.Context(), outbox.ListParams{Tool: "create_entities", States: []outbox.State{outbox.StateSucceeded}, CreatedAfter: time.Now().Add(-time.Hour)})
	require.NoError(t, err)
	require.Len(t, page.Keys, 1)
}
