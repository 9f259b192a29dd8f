package proxy_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/agents/pgoncemcp/proxy"
)

// TestProxyFilesystem runs the proxy in front of
// @modelcontextprotocol/server-filesystem from npm, and reads the files it
// wrote.
func TestProxyFilesystem(t *testing.T) {
	t.Parallel()

	type testBundle struct {
		*bundle
		dir      string // the directory the server may write in
		log      string // what the server received
		upstream proxy.Upstream
		session  *mcp.ClientSession
	}
	setup := func(t *testing.T) *testBundle {
		t.Helper()
		dir, err := filepath.EvalSymlinks(t.TempDir())
		require.NoError(t, err)
		upstream, log := recorded(t, serverScript(t, "server-filesystem"), dir)
		b := start(t, proxy.Config{Upstream: upstream})
		return &testBundle{bundle: b, dir: dir, log: log, upstream: upstream, session: connect(t, b.proxy.Server())}
	}
	// edit appends " +1" to the line "ledger:" of path, each time it acts.
	edit := func(path string) string {
		return string(mustJSON(t, map[string]any{"path": path, "edits": []map[string]string{{"oldText": "ledger:", "newText": "ledger: +1"}}}))
	}
	applied := func(t *testing.T, path string) int {
		t.Helper()
		data, err := os.ReadFile(path) //nolint:gosec // the test's own file
		require.NoError(t, err)
		return strings.Count(string(data), "+1")
	}

	t.Run("EditFileActsOnceAndReplaysTheStoredResultVerbatim", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		path := filepath.Join(b.dir, "ledger.txt")
		require.NoError(t, os.WriteFile(path, []byte("ledger:\n"), 0o600))

		first, err := b.session.CallTool(t.Context(), call("edit_file", "run-1", 1, edit(path)))
		require.NoError(t, err)
		require.False(t, first.IsError, text(first))
		second, err := b.session.CallTool(t.Context(), call("edit_file", "run-1", 1, edit(path)))
		require.NoError(t, err)
		requireReplay(t, first, second)
		require.Equal(t, 1, applied(t, path), "the edit was applied once")

		// A new step is a new action: it acts.
		third, err := b.session.CallTool(t.Context(), call("edit_file", "run-1", 2, edit(path)))
		require.NoError(t, err)
		require.False(t, third.IsError, text(third))
		require.Equal(t, 2, applied(t, path))
		require.Equal(t, []string{
			string(keyOf(t, "edit_file", "run-1", 1, edit(path))),
			string(keyOf(t, "edit_file", "run-1", 2, edit(path))),
		}, sentKeys(t, b.log, "edit_file"))
	})

	t.Run("WriteFileWritesOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		path := filepath.Join(b.dir, "note.txt")
		args := string(mustJSON(t, map[string]string{"path": path, "content": "refund 8842: 42.00"}))
		res, err := b.session.CallTool(t.Context(), call("write_file", "run-1", 1, args))
		require.NoError(t, err)
		require.False(t, res.IsError, text(res))

		// Someone else changes the file; a second write would undo it.
		require.NoError(t, os.WriteFile(path, []byte("changed since"), 0o600))
		res, err = b.session.CallTool(t.Context(), call("write_file", "run-1", 1, args))
		require.NoError(t, err)
		require.False(t, res.IsError, text(res))
		data, err := os.ReadFile(path) //nolint:gosec // the test's own file
		require.NoError(t, err)
		require.Equal(t, "changed since", string(data))
		require.Len(t, sentKeys(t, b.log, "write_file"), 1)
	})

	t.Run("ReadTextFilePassesThrough", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		path := filepath.Join(b.dir, "note.txt")
		args := string(mustJSON(t, map[string]string{"path": path}))
		for _, content := range []string{"first", "second"} {
			require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
			res, err := b.session.CallTool(t.Context(), call("read_text_file", "run-1", 1, args))
			require.NoError(t, err)
			require.False(t, res.IsError, text(res))
			require.Contains(t, text(res), content)
		}
		require.Len(t, sentKeys(t, b.log, "read_text_file"), 2)
	})

	t.Run("TheUpstreamsOwnErrorsComeBackUnchanged", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		path := filepath.Join(b.dir, "ledger.txt")
		require.NoError(t, os.WriteFile(path, []byte("nothing to edit\n"), 0o600))
		want, err := direct(t, b.upstream).CallTool(t.Context(), &mcp.CallToolParams{Name: "edit_file", Arguments: json.RawMessage(edit(path))})
		require.NoError(t, err)
		require.True(t, want.IsError, "the upstream refuses an edit whose text is not in the file")

		for range 2 {
			got, err := b.session.CallTool(t.Context(), call("edit_file", "run-1", 1, edit(path)))
			require.NoError(t, err)
			require.Equal(t, toolResultJSON(t, want), toolResultJSON(t, got))
		}
		// And outside the allowed directories, the upstream's refusal too.
		outside := string(mustJSON(t, map[string]string{"path": "/etc/pgonce-nowhere", "content": "x"}))
		want, err = direct(t, b.upstream).CallTool(t.Context(), &mcp.CallToolParams{Name: "write_file", Arguments: json.RawMessage(outside)})
		require.NoError(t, err)
		require.True(t, want.IsError)
		got, err := b.session.CallTool(t.Context(), call("write_file", "run-1", 2, outside))
		require.NoError(t, err)
		require.Equal(t, toolResultJSON(t, want), toolResultJSON(t, got))
	})
}
