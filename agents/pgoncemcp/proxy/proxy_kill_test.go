package proxy_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/agents/pgoncemcp"
	"github.com/pgonce/pgonce/agents/pgoncemcp/proxy"
	"github.com/pgonce/pgonce/outbox"
)

var (
	buildOnce sync.Once
	binDir    string
	binPath   string
	errBuild  error
)

// proxyBinary builds pgonce-mcp-proxy once for the package's tests.
func proxyBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, errBuild = os.MkdirTemp("", "pgonce-mcp-proxy-test-")
		if errBuild != nil {
			return
		}
		binPath = filepath.Join(binDir, "pgonce-mcp-proxy")
		out, err := newCommand("go", "build", "-o", binPath, "../cmd/pgonce-mcp-proxy").CombinedOutput()
		if err != nil {
			errBuild = &buildError{err: err, out: string(out)}
		}
	})
	require.NoError(t, errBuild)
	return binPath
}

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string { return "go build: " + e.err.Error() + "\n" + e.out }

// stderrWatcher keeps a process's standard error and closes held once the
// line of a held call appears in it.
type stderrWatcher struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	once sync.Once
	held chan struct{}
}

func (w *stderrWatcher) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if strings.Contains(w.buf.String(), proxy.TestHoldLine) {
		w.once.Do(func() { close(w.held) })
	}
	return len(p), nil
}

func (w *stderrWatcher) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// process is a pgonce-mcp-proxy process and an agent's session of it.
type process struct {
	cmd     *exec.Cmd
	session *mcp.ClientSession
	stderr  *stderrWatcher
}

// launch starts pgonce-mcp-proxy with the configuration file at config,
// holding calls of holdTool after the upstream answered them when it is
// set ([proxy.TestHoldEnv]), and connects to it over stdio.
func launch(t *testing.T, config, holdTool string) *process {
	t.Helper()
	cmd := newCommand(proxyBinary(t), "-config", config)
	cmd.Env = append(os.Environ(), "PGONCE_DATABASE_URL="+databaseURL())
	if holdTool != "" {
		cmd.Env = append(cmd.Env, proxy.TestHoldEnv+"="+holdTool)
	}
	w := &stderrWatcher{held: make(chan struct{})}
	cmd.Stderr = w
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pgonce-mcp-proxy's standard error:\n%s", w)
		}
	})
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).
		Connect(t.Context(), &mcp.CommandTransport{Command: cmd}, nil)
	require.NoError(t, err, "start pgonce-mcp-proxy: %s", w)
	t.Cleanup(func() { _ = cs.Close() })
	return &process{cmd: cmd, session: cs, stderr: w}
}

// TestProxyKilledMidCall kills pgonce-mcp-proxy with SIGKILL after the
// upstream, @modelcontextprotocol/server-memory from npm, created an entity
// and before the proxy recorded it, then asks for the same action through
// a new proxy process: the call is never sent twice blindly.
func TestProxyKilledMidCall(t *testing.T) {
	t.Parallel()

	const args = `{"entities":[{"name":"ada","entityType":"customer","observations":["asked for a refund"]}]}`
	params := func() *mcp.CallToolParams { return call("create_entities", "run-1", 1, args) }

	type testBundle struct {
		memory *memory
		config string
		key    outbox.Key
	}
	// setup writes the proxy's configuration file, with create_entities by
	// delivery and a short lease, so that the reconciler of the new
	// process settles the killed one's call soon; then it starts a proxy,
	// asks for the action, and kills the proxy once the upstream answered.
	setup := func(t *testing.T, delivery proxy.Delivery) *testBundle {
		t.Helper()
		m := newMemory(t)
		schema := newSchema(t)
		config := proxy.Config{
			Upstream:       m.upstream,
			Schema:         schema,
			Tools:          map[string]proxy.Tool{"create_entities": {Delivery: delivery}},
			CallTimeout:    proxy.Duration(5 * time.Second),
			Lease:          proxy.Duration(6 * time.Second),
			ReconcileEvery: proxy.Duration(100 * time.Millisecond),
			ReconcileGrace: proxy.Duration(time.Millisecond),
		}
		path := filepath.Join(t.TempDir(), "proxy.json")
		require.NoError(t, os.WriteFile(path, mustJSON(t, config), 0o600))
		client, err := outbox.NewPgx(testPool(t), config.OutboxConfig())
		require.NoError(t, err)
		key := keyOf(t, "create_entities", "run-1", 1, args)

		killed := launch(t, path, "create_entities")
		asked := make(chan error, 1)
		go func() {
			_, err := killed.session.CallTool(context.WithoutCancel(t.Context()), params())
			asked <- err
		}()
		select {
		case <-killed.stderr.held:
		case err := <-asked:
			t.Fatalf("the call ended before the upstream answered it: %v", err)
		case <-t.Context().Done():
			t.Fatal("the upstream never answered")
		}
		require.Equal(t, map[string]int{"ada": 1}, m.entities(t), "the upstream acted")
		res, err := client.Get(t.Context(), key)
		require.NoError(t, err)
		require.Equal(t, outbox.StateInFlight, res.State, "nothing recorded yet")

		require.NoError(t, killed.cmd.Process.Kill())
		require.Error(t, <-asked, "the agent lost its proxy mid-call")
		require.Equal(t, []string{string(key)}, sentKeys(t, m.log, "create_entities"))
		return &testBundle{memory: m, config: path, key: key}
	}
	askUntil := func(t *testing.T, p *process) *mcp.CallToolResult {
		t.Helper()
		return askUntilSettled(t, p, params)
	}

	t.Run("AtMostOnceGoesToReviewAndIsNeverSentAgain", func(t *testing.T) {
		t.Parallel()
		b := setup(t, proxy.DeliveryAtMostOnce)
		// An upstream that acted again would write ada back.
		b.memory.forget(t)

		restarted := launch(t, b.config, "")
		res := askUntil(t, restarted)
		obs, ok := pgoncemcp.ObservationOf(res)
		require.True(t, ok, text(res))
		require.Equal(t, outbox.ObservationNeedsReview, obs.Status, text(res))
		res = askUntil(t, restarted)
		obs, ok = pgoncemcp.ObservationOf(res)
		require.True(t, ok, text(res))
		require.Equal(t, outbox.ObservationNeedsReview, obs.Status)

		require.Empty(t, b.memory.entities(t), "never sent again")
		require.Len(t, sentKeys(t, b.memory.log, "create_entities"), 1, "the upstream saw the call once")
	})

	t.Run("ByKeyIsSentAgainWithTheSameKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t, proxy.DeliveryByKey)

		restarted := launch(t, b.config, "")
		res := askUntil(t, restarted)
		require.False(t, res.IsError, text(res))
		again, err := restarted.session.CallTool(t.Context(), params())
		require.NoError(t, err)
		requireReplay(t, res, again) // recorded, and replayed verbatim

		require.Equal(t, []string{string(b.key), string(b.key)}, sentKeys(t, b.memory.log, "create_entities"),
			"sent again once, with the same key in _meta, for an upstream that honours it to deduplicate")
		// server-memory does not honour keys, but creates an entity once
		// per name.
		require.Equal(t, map[string]int{"ada": 1}, b.memory.entities(t))
	})
}

// askUntilSettled asks for the action of params through p until the answer
// is not "in progress" (the killed call's lease, until it expires and the
// reconciler settles it), and returns it.
func askUntilSettled(t *testing.T, p *process, params func() *mcp.CallToolParams) *mcp.CallToolResult {
	t.Helper()
	for {
		res, err := p.session.CallTool(t.Context(), params())
		require.NoError(t, err)
		obs, ok := pgoncemcp.ObservationOf(res)
		if !ok || obs.Status != outbox.ObservationInProgress {
			return res
		}
		select {
		case <-t.Context().Done():
			t.Fatal("the killed call was never settled")
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// TestProxyKilledMidEdit kills pgonce-mcp-proxy with SIGKILL after the
// upstream, @modelcontextprotocol/server-filesystem from npm, applied an
// edit and before the proxy recorded it. edit_file is not idempotent (each
// application appends " +1"), and the server does not honour keys: at most
// once, the edit goes to review and stays applied once.
func TestProxyKilledMidEdit(t *testing.T) {
	t.Parallel()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	require.NoError(t, err)
	upstream, log := recorded(t, serverScript(t, "server-filesystem"), dir)
	path := filepath.Join(dir, "ledger.txt")
	require.NoError(t, os.WriteFile(path, []byte("ledger:\n"), 0o600))
	args := string(mustJSON(t, map[string]any{"path": path, "edits": []map[string]string{{"oldText": "ledger:", "newText": "ledger: +1"}}}))
	params := func() *mcp.CallToolParams { return call("edit_file", "run-1", 1, args) }
	applied := func() int {
		data, err := os.ReadFile(path) //nolint:gosec // the test's own file
		require.NoError(t, err)
		return strings.Count(string(data), "+1")
	}

	config := proxy.Config{
		Upstream:       upstream,
		Schema:         newSchema(t),
		CallTimeout:    proxy.Duration(5 * time.Second),
		Lease:          proxy.Duration(6 * time.Second),
		ReconcileEvery: proxy.Duration(100 * time.Millisecond),
		ReconcileGrace: proxy.Duration(time.Millisecond),
	}
	configPath := filepath.Join(t.TempDir(), "proxy.json")
	require.NoError(t, os.WriteFile(configPath, mustJSON(t, config), 0o600))

	killed := launch(t, configPath, "edit_file")
	asked := make(chan error, 1)
	go func() {
		_, err := killed.session.CallTool(context.WithoutCancel(t.Context()), params())
		asked <- err
	}()
	select {
	case <-killed.stderr.held:
	case err := <-asked:
		t.Fatalf("the call ended before the upstream answered it: %v", err)
	case <-t.Context().Done():
		t.Fatal("the upstream never answered")
	}
	require.Equal(t, 1, applied(), "the upstream acted")
	require.NoError(t, killed.cmd.Process.Kill())
	require.Error(t, <-asked)

	restarted := launch(t, configPath, "")
	res := askUntilSettled(t, restarted, params)
	obs, ok := pgoncemcp.ObservationOf(res)
	require.True(t, ok, text(res))
	require.Equal(t, outbox.ObservationNeedsReview, obs.Status, "the default delivery is at most once")
	require.Equal(t, 1, applied(), "applied once, never twice")
	require.Len(t, sentKeys(t, log, "edit_file"), 1)
}
