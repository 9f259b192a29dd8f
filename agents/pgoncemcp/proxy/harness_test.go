package proxy_test

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/agents/pgoncemcp"
	"github.com/pgonce/pgonce/agents/pgoncemcp/proxy"
	"github.com/pgonce/pgonce/oncetest"
	"github.com/pgonce/pgonce/outbox"
)

// databaseURLDefault is the database the tests use unless
// PGONCE_TEST_DATABASE_URL names another, as pgonce's own tests do.
const databaseURLDefault = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// serversEnv names the directory that holds node_modules with the npm MCP
// servers, when it is not .ci/mcp-servers.
const serversEnv = "PGONCE_MCP_SERVERS"

var (
	poolOnce sync.Once
	pool     *pgxpool.Pool
	errPool  error
)

func databaseURL() string {
	return cmp.Or(os.Getenv("PGONCE_TEST_DATABASE_URL"), databaseURLDefault)
}

// testPool returns the pool the package's tests share. A database that
// cannot be reached fails the test, which says which database it tried.
func testPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	url := databaseURL()
	poolOnce.Do(func() {
		config, err := pgxpool.ParseConfig(url)
		if err != nil {
			errPool = err
			return
		}
		config.MaxConns = 32
		pool, errPool = pgxpool.NewWithConfig(context.Background(), config)
		if errPool == nil {
			errPool = pool.Ping(context.Background())
		}
	})
	require.NoError(t, errPool, "PostgreSQL at %s (set PGONCE_TEST_DATABASE_URL)", url)
	return pool
}

// serverScript returns the entry point of an npm MCP server package, which
// .ci/npm-servers installs; the test fails, never skips, without it.
func serverScript(t *testing.T, pkg string) string {
	t.Helper()
	dir := os.Getenv(serversEnv)
	if dir == "" {
		var err error
		dir, err = filepath.Abs(filepath.Join("..", "..", "..", ".ci", "mcp-servers"))
		require.NoError(t, err)
	}
	script := filepath.Join(dir, "node_modules", "@modelcontextprotocol", pkg, "dist", "index.js")
	_, err := os.Stat(script)
	require.NoError(t, err, "the npm MCP server %s is not installed in %s: run `bash .ci/npm-servers` (or set $%s)", pkg, dir, serversEnv)
	return script
}

// recorded starts script with node behind tee, which appends every message
// the proxy sends the upstream to the returned log: what the upstream
// received, _meta included. tee only copies; the server is the npm one.
func recorded(t *testing.T, script string, args ...string) (upstream proxy.Upstream, log string) {
	t.Helper()
	log = filepath.Join(t.TempDir(), "upstream-stdin.jsonl")
	shArgs := append([]string{"-c", `log=$1; shift; tee -a "$log" | exec node "$@"`, "sh", log, script}, args...)
	return proxy.Upstream{Command: "sh", Args: shArgs}, log
}

// memory is a knowledge-graph server from npm, @modelcontextprotocol/server-memory,
// writing its graph to a file of the test's own.
type memory struct {
	upstream proxy.Upstream
	graph    string // the JSON-lines graph file the server writes
	log      string // what the server received
}

func newMemory(t *testing.T) *memory {
	t.Helper()
	upstream, log := recorded(t, serverScript(t, "server-memory"))
	graph := filepath.Join(t.TempDir(), "graph.jsonl")
	upstream.Env = map[string]string{"MEMORY_FILE_PATH": graph}
	return &memory{upstream: upstream, graph: graph, log: log}
}

// entities returns how many entities of each name the graph file holds.
func (m *memory) entities(t *testing.T) map[string]int {
	t.Helper()
	data, err := os.ReadFile(m.graph)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]int{}
	}
	require.NoError(t, err)
	counts := map[string]int{}
	for _, line := range bytes.Split(data, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var item struct {
			Type string `json:"type"`
			Name string `json:"name"`
		}
		require.NoError(t, json.Unmarshal(line, &item), "graph line %s", line)
		if item.Type == "entity" {
			counts[item.Name]++
		}
	}
	return counts
}

// forget empties the graph, as another writer would: an upstream that acts
// again writes the entity back.
func (m *memory) forget(t *testing.T) {
	t.Helper()
	require.NoError(t, os.WriteFile(m.graph, nil, 0o600))
}

// sentKeys returns the _meta key of each tools/call of tool that the
// upstream received, in order ("" for a call without one).
func sentKeys(t *testing.T, log, tool string) []string {
	t.Helper()
	f, err := os.Open(log) //nolint:gosec // the test's own file
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	require.NoError(t, err)
	defer func() { _ = f.Close() }()
	var keys []string
	scanner := bufio.NewScanner(f)
	scanner.Buffer(nil, 1<<20)
	for scanner.Scan() {
		var msg struct {
			Method string `json:"method"`
			Params struct {
				Name string         `json:"name"`
				Meta map[string]any `json:"_meta"`
			} `json:"params"`
		}
		if json.Unmarshal(scanner.Bytes(), &msg) != nil || msg.Method != "tools/call" || msg.Params.Name != tool {
			continue
		}
		key, _ := msg.Params.Meta[pgoncemcp.MetaKey].(string)
		keys = append(keys, key)
	}
	require.NoError(t, scanner.Err())
	return keys
}

// bundle is one test's schema, client and proxy session.
type bundle struct {
	schema string
	client *outbox.Client[pgx.Tx]
	proxy  *proxy.Proxy[pgx.Tx]
}

// newSchema migrates a schema of the test's own.
func newSchema(t *testing.T) string {
	t.Helper()
	return oncetest.SchemaPgx(t, testPool(t))
}

// start runs a proxy in the test's process over a schema of its own, with
// config, and returns it.
func start(t *testing.T, config proxy.Config) *bundle {
	t.Helper()
	schema := newSchema(t)
	config.Schema = schema
	client, err := outbox.NewPgx(testPool(t), config.OutboxConfig())
	require.NoError(t, err)
	p, err := proxy.New(t.Context(), client, config, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return &bundle{schema: schema, client: client, proxy: p}
}

// connect returns a client session of the proxy.
func connect(t *testing.T, server *mcp.Server) *mcp.ClientSession {
	t.Helper()
	ct, st := mcp.NewInMemoryTransports()
	ss, err := server.Connect(t.Context(), st, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).Connect(t.Context(), ct, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// direct returns a client session of the upstream itself, without a proxy.
func direct(t *testing.T, upstream proxy.Upstream) *mcp.ClientSession {
	t.Helper()
	cmd := newCommand(upstream.Command, upstream.Args...)
	if len(upstream.Env) > 0 {
		cmd.Env = os.Environ()
		for k, v := range upstream.Env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).Connect(t.Context(), &mcp.CommandTransport{Command: cmd}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// call is a tools/call of tool with args (JSON) at step of run.
func call(tool, runID string, step int64, args string) *mcp.CallToolParams {
	return &mcp.CallToolParams{Name: tool, Arguments: json.RawMessage(args), Meta: pgoncemcp.StepMeta(runID, step)}
}

// keyOf derives the key the proxy derives for a call at step of run.
func keyOf(t *testing.T, tool, runID string, step int64, args string) outbox.Key {
	t.Helper()
	key, err := outbox.DeriveKey(outbox.Call{RunID: runID, Step: step, Tool: tool, Args: json.RawMessage(args)})
	require.NoError(t, err)
	return key
}

// resultJSON is a result as the wire carries it.
func resultJSON(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	b, err := json.Marshal(res)
	require.NoError(t, err)
	return string(b)
}

// text is a result's text content.
func text(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// toolResultJSON is what a tool answered in a result: the result as the wire
// carries it without the members the protocol adds to every result a server
// sends (its resultType, and the server's name in _meta), which differ
// between the upstream and the proxy, and without pgonce's mark.
func toolResultJSON(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	var members map[string]any
	require.NoError(t, json.Unmarshal([]byte(resultJSON(t, res)), &members))
	delete(members, "resultType")
	if meta, ok := members["_meta"].(map[string]any); ok {
		delete(meta, "io.modelcontextprotocol/serverInfo")
		delete(meta, pgoncemcp.MetaAction)
		if len(meta) == 0 {
			delete(members, "_meta")
		}
	}
	b, err := json.Marshal(members)
	require.NoError(t, err)
	return string(b)
}

// requireReplay checks that again is first replayed: the same result on the
// wire but for pgonce's mark in _meta, which says that again is a replay of
// the same action.
func requireReplay(t *testing.T, first, again *mcp.CallToolResult) {
	t.Helper()
	unmarked := func(res *mcp.CallToolResult) string {
		var members map[string]any
		require.NoError(t, json.Unmarshal([]byte(resultJSON(t, res)), &members))
		if meta, ok := members["_meta"].(map[string]any); ok {
			delete(meta, pgoncemcp.MetaAction)
			if len(meta) == 0 {
				delete(members, "_meta")
			}
		}
		b, err := json.Marshal(members)
		require.NoError(t, err)
		return string(b)
	}
	require.Equal(t, unmarked(first), unmarked(again), "the stored result, verbatim")
	firstMark, ok := pgoncemcp.ActionMarkOf(first)
	require.True(t, ok, "the first result carries pgonce's mark")
	againMark, ok := pgoncemcp.ActionMarkOf(again)
	require.True(t, ok, "the replay carries pgonce's mark")
	require.True(t, againMark.Replayed, "the replay says so")
	require.Equal(t, firstMark.Key, againMark.Key)
}
