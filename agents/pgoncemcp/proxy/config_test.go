package proxy_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/agents/pgoncemcp/proxy"
	"github.com/pgonce/pgonce/outbox"
)

func TestParseConfig(t *testing.T) {
	t.Parallel()

	t.Run("ReadsTheFile", func(t *testing.T) {
		t.Parallel()
		config, err := proxy.ParseConfig([]byte(`{
			"upstream": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory"], "env": {"MEMORY_FILE_PATH": "/var/lib/memory.jsonl"}},
			"schema": "agents",
			"tools": {"create_entities": {"delivery": "by_key"}, "read_graph": {"read_only": false}, "Send Mail": {"name": "send_mail"}},
			"lease": "45s", "call_timeout": "10s", "reconcile_every": "1m"
		}`))
		require.NoError(t, err)
		require.Equal(t, "npx", config.Upstream.Command)
		require.Equal(t, proxy.DeliveryByKey, config.Tools["create_entities"].Delivery)
		require.False(t, *config.Tools["read_graph"].ReadOnly)
		require.Equal(t, proxy.Duration(time.Minute), config.ReconcileEvery)
		oc := config.OutboxConfig()
		require.Equal(t, "agents", oc.Schema)
		require.Equal(t, 45*time.Second, oc.Lease)
		require.Equal(t, 10*time.Second, oc.CallTimeout)
		require.NotNil(t, oc.Registry)
	})

	t.Run("DefaultsAreTheSafeOnes", func(t *testing.T) {
		t.Parallel()
		config, err := proxy.ParseConfig([]byte(`{"upstream": {"url": "https://mcp.example.com/mcp"}}`))
		require.NoError(t, err)
		require.Equal(t, proxy.SchemaDefault, config.OutboxConfig().Schema)
		require.Empty(t, config.Tools)
		require.Empty(t, config.Anonymous)
	})

	t.Run("RefusesWhatCannotRun", func(t *testing.T) {
		t.Parallel()
		for _, tt := range []struct{ name, json, says string }{
			{"NoUpstream", `{}`, "upstream needs a command or a url"},
			{"TwoUpstreams", `{"upstream": {"command": "x", "url": "http://h/mcp"}}`, "set one"},
			{"AURLThatIsNotHTTP", `{"upstream": {"url": "ftp://h/mcp"}}`, "http://"},
			{"ArgsWithAURL", `{"upstream": {"url": "http://h/mcp", "args": ["a"]}}`, "go with a command"},
			{"HeadersWithACommand", `{"upstream": {"command": "x", "header_env": {"Authorization": "T"}}}`, "goes with a url"},
			{"AnUnknownDelivery", `{"upstream": {"command": "x"}, "tools": {"t": {"delivery": "twice"}}}`, `"twice"`},
			{"ABadToolName", `{"upstream": {"command": "x"}, "tools": {"t": {"name": "Send Mail"}}}`, "tools[\"t\"].name"},
			{"AnUnknownAnonymous", `{"upstream": {"command": "x"}, "anonymous": "maybe"}`, "anonymous"},
			{"ANegativeLease", `{"upstream": {"command": "x"}, "lease": "-1s"}`, "lease must not be negative"},
			{"ADurationThatIsANumber", `{"upstream": {"command": "x"}, "lease": 30}`, "duration"},
			{"AnUnknownField", `{"upstream": {"command": "x"}, "tool": {}}`, `unknown field "tool"`},
			{"TwoValues", `{"upstream": {"command": "x"}} {}`, "more than one"},
			{"NotJSON", `upstream = "x"`, "invalid"},
		} {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				_, err := proxy.ParseConfig([]byte(tt.json))
				require.ErrorIs(t, err, proxy.ErrInvalidConfig)
				require.ErrorContains(t, err, tt.says)
			})
		}
	})

	t.Run("LoadConfigNamesTheFile", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "proxy.json")
		require.NoError(t, os.WriteFile(path, []byte(`{"upstream": {}}`), 0o600))
		_, err := proxy.LoadConfig(path)
		require.ErrorIs(t, err, proxy.ErrInvalidConfig)
		require.ErrorContains(t, err, path)
		_, err = proxy.LoadConfig(filepath.Join(t.TempDir(), "missing.json"))
		require.ErrorIs(t, err, proxy.ErrInvalidConfig)
	})

	t.Run("DatabaseURLComesFromTheNamedVariable", func(t *testing.T) {
		t.Parallel()
		_, err := proxy.Config{DatabaseURLEnv: "PGONCE_TEST_PROXY_UNSET_VARIABLE"}.DatabaseURL()
		require.ErrorIs(t, err, proxy.ErrInvalidConfig)
		require.ErrorContains(t, err, "$PGONCE_TEST_PROXY_UNSET_VARIABLE")
	})
}

func TestNewRefusesBadInput(t *testing.T) {
	t.Parallel()

	t.Run("ANilClient", func(t *testing.T) {
		t.Parallel()
		_, err := proxy.New[any](t.Context(), nil, proxy.Config{Upstream: proxy.Upstream{Command: "true"}}, nil)
		require.ErrorIs(t, err, proxy.ErrInvalidConfig)
	})

	t.Run("AnUpstreamThatIsNotAnMCPServer", func(t *testing.T) {
		t.Parallel()
		schema := newSchema(t)
		config := proxy.Config{Upstream: proxy.Upstream{Command: "true"}, Schema: schema}
		client, err := outbox.NewPgx(testPool(t), config.OutboxConfig())
		require.NoError(t, err)
		_, err = proxy.New(t.Context(), client, config, nil)
		require.ErrorIs(t, err, proxy.ErrUpstream)
	})

	t.Run("TwoToolsUnderOnePgonceName", func(t *testing.T) {
		t.Parallel()
		m := newMemory(t)
		schema := newSchema(t)
		config := proxy.Config{Upstream: m.upstream, Schema: schema, Tools: map[string]proxy.Tool{
			"create_entities": {Name: "create"}, "create_relations": {Name: "create"},
		}}
		client, err := outbox.NewPgx(testPool(t), config.OutboxConfig())
		require.NoError(t, err)
		_, err = proxy.New(t.Context(), client, config, nil)
		require.ErrorIs(t, err, proxy.ErrInvalidConfig)
		require.ErrorContains(t, err, "already registered")
	})
}
