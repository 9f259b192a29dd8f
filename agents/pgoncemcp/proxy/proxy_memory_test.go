package proxy_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/agents/pgoncemcp"
	"github.com/pgonce/pgonce/agents/pgoncemcp/proxy"
	"github.com/pgonce/pgonce/outbox"
)

// entity is create_entities' arguments for one entity named name.
func entity(name string) string {
	return `{"entities":[{"name":"` + name + `","entityType":"customer","observations":["asked for a refund"]}]}`
}

// TestProxyMemory runs the proxy in front of @modelcontextprotocol/server-memory
// from npm, and counts the entities its graph file holds.
func TestProxyMemory(t *testing.T) {
	t.Parallel()

	type testBundle struct {
		*bundle
		memory  *memory
		session *mcp.ClientSession
	}
	setup := func(t *testing.T, tools map[string]proxy.Tool) *testBundle {
		t.Helper()
		m := newMemory(t)
		b := start(t, proxy.Config{Upstream: m.upstream, Tools: tools})
		return &testBundle{bundle: b, memory: m, session: connect(t, b.proxy.Server())}
	}

	t.Run("ListsTheUpstreamsToolsAsTheyAre", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		var viaProxy, viaUpstream []*mcp.Tool
		for tool, err := range b.session.Tools(t.Context(), nil) {
			require.NoError(t, err)
			viaProxy = append(viaProxy, tool)
		}
		for tool, err := range direct(t, b.memory.upstream).Tools(t.Context(), nil) {
			require.NoError(t, err)
			viaUpstream = append(viaUpstream, tool)
		}
		require.NotEmpty(t, viaUpstream)
		// The proxy lists them by name; each is the upstream's as it is.
		byName := func(tools []*mcp.Tool) map[string]*mcp.Tool {
			m := map[string]*mcp.Tool{}
			for _, tool := range tools {
				m[tool.Name] = tool
			}
			return m
		}
		require.JSONEq(t, string(mustJSON(t, byName(viaUpstream))), string(mustJSON(t, byName(viaProxy))))
	})

	t.Run("ASideEffectingToolActsOnceAndReplaysTheStoredResultVerbatim", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		params := call("create_entities", "run-1", 1, entity("ada"))
		first, err := b.session.CallTool(t.Context(), params)
		require.NoError(t, err)
		require.False(t, first.IsError, text(first))
		require.Equal(t, map[string]int{"ada": 1}, b.memory.entities(t))

		// An upstream that acted again would write ada back.
		b.memory.forget(t)
		second, err := b.session.CallTool(t.Context(), call("create_entities", "run-1", 1, entity("ada")))
		require.NoError(t, err)
		requireReplay(t, first, second)
		require.Empty(t, b.memory.entities(t), "the upstream acted once")

		key := keyOf(t, "create_entities", "run-1", 1, entity("ada"))
		require.Equal(t, []string{string(key)}, sentKeys(t, b.memory.log, "create_entities"),
			"one call reached the upstream, with the key in its _meta")
		res, err := b.client.Get(t.Context(), key)
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, res.State)
	})

	t.Run("ADuplicateWhileTheFirstRunsIsInProgress", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		answered, release := make(chan struct{}), make(chan struct{})
		proxy.SetAfterUpstreamFunc(b.proxy, func(context.Context, string) {
			close(answered)
			<-release
		})
		type outcome struct {
			res *mcp.CallToolResult
			err error
		}
		firstDone := make(chan outcome, 1)
		go func() {
			res, err := b.session.CallTool(context.WithoutCancel(t.Context()), call("create_entities", "run-1", 1, entity("ada")))
			firstDone <- outcome{res, err}
		}()
		<-answered

		const duplicates = 8
		results := make(chan outcome, duplicates)
		for range duplicates {
			cs := connect(t, b.proxy.Server())
			go func() {
				res, err := cs.CallTool(t.Context(), call("create_entities", "run-1", 1, entity("ada")))
				results <- outcome{res, err}
			}()
		}
		for range duplicates {
			o := <-results
			require.NoError(t, o.err)
			obs, ok := pgoncemcp.ObservationOf(o.res)
			require.True(t, ok, text(o.res))
			require.Equal(t, outbox.ObservationInProgress, obs.Status)
		}
		close(release)
		first := <-firstDone
		require.NoError(t, first.err)
		require.False(t, first.res.IsError, text(first.res))
		require.Equal(t, map[string]int{"ada": 1}, b.memory.entities(t))
		require.Len(t, sentKeys(t, b.memory.log, "create_entities"), 1, "one call reached the upstream")
	})

	t.Run("AKeyReusedWithOtherArgumentsIsAConflict", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		withKey := func(args string) *mcp.CallToolParams {
			return &mcp.CallToolParams{Name: "create_entities", Arguments: json.RawMessage(args), Meta: pgoncemcp.KeyMeta("order-8842")}
		}
		res, err := b.session.CallTool(t.Context(), withKey(entity("ada")))
		require.NoError(t, err)
		require.False(t, res.IsError, text(res))

		res, err = b.session.CallTool(t.Context(), withKey(entity("grace")))
		require.NoError(t, err)
		obs, ok := pgoncemcp.ObservationOf(res)
		require.True(t, ok, text(res))
		require.Equal(t, outbox.ObservationConflict, obs.Status)
		require.Equal(t, map[string]int{"ada": 1}, b.memory.entities(t), "grace was never created")
		require.Len(t, sentKeys(t, b.memory.log, "create_entities"), 1)
	})

	t.Run("AReadOnlyToolPassesThrough", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		res, err := b.session.CallTool(t.Context(), call("create_entities", "run-1", 1, entity("ada")))
		require.NoError(t, err)
		require.False(t, res.IsError, text(res))

		// read_graph is annotated read-only: each call reaches the upstream
		// and reads the graph as it is now; nothing is stored.
		read := func() string {
			res, err := b.session.CallTool(t.Context(), call("read_graph", "run-1", 2, `{}`))
			require.NoError(t, err)
			require.False(t, res.IsError, text(res))
			return text(res)
		}
		require.Contains(t, read(), "ada")
		b.memory.forget(t)
		require.NotContains(t, read(), "ada")
		require.Len(t, sentKeys(t, b.memory.log, "read_graph"), 2)
		_, err = b.client.Get(t.Context(), keyOf(t, "read_graph", "run-1", 2, `{}`))
		require.ErrorIs(t, err, outbox.ErrNotFound)
	})

	t.Run("AReadOnlyOverrideGuardsATool", func(t *testing.T) {
		t.Parallel()
		guarded := false
		b := setup(t, map[string]proxy.Tool{"read_graph": {ReadOnly: &guarded}})
		for range 2 {
			res, err := b.session.CallTool(t.Context(), call("read_graph", "run-1", 2, `{}`))
			require.NoError(t, err)
			require.False(t, res.IsError, text(res))
		}
		require.Len(t, sentKeys(t, b.memory.log, "read_graph"), 1, "the second call got the stored result")
	})

	t.Run("TheUpstreamsOwnErrorsComeBackUnchanged", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		args := `{"observations":[{"entityName":"nobody","contents":["x"]}]}`
		want, err := direct(t, b.memory.upstream).CallTool(t.Context(), &mcp.CallToolParams{Name: "add_observations", Arguments: json.RawMessage(args)})
		require.NoError(t, err)
		require.True(t, want.IsError, "the upstream refuses an observation of an unknown entity")
		require.Contains(t, text(want), "nobody")

		for range 2 { // the tool's answer, stored and replayed
			got, err := b.session.CallTool(t.Context(), call("add_observations", "run-1", 1, args))
			require.NoError(t, err)
			require.Equal(t, toolResultJSON(t, want), toolResultJSON(t, got))
		}
		require.Len(t, sentKeys(t, b.memory.log, "add_observations"), 2, "one call of the test's own, one through the proxy")
	})

	t.Run("ACallThatNamesNoActionIsRefused", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		_, err := b.session.CallTool(t.Context(), &mcp.CallToolParams{Name: "create_entities", Arguments: json.RawMessage(entity("ada"))})
		require.ErrorContains(t, err, pgoncemcp.MetaRunID)
		require.Empty(t, b.memory.entities(t))
		require.Empty(t, sentKeys(t, b.memory.log, "create_entities"))
	})
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}
