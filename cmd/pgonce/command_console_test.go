package main

import (
	"bufio"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
)

func TestConsole(t *testing.T) {
	t.Parallel()

	t.Run("RefusesNonLoopbackWithoutToken", func(t *testing.T) {
		t.Parallel()
		for _, addr := range []string{"0.0.0.0:0", ":8480", "[::]:0"} {
			res := pgonceEnv(t, []string{"PGONCE_CONSOLE_TOKEN="}, "console", "--listen", addr)
			require.Equal(t, exitUsage, res.code, res.stderr)
			require.Contains(t, res.stderr, "requires a token")
			require.Contains(t, res.stderr, "--token")
			require.Empty(t, res.stdout, "nothing was served")
		}
	})

	t.Run("ServesOnLoopback", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		review := f.needsReview(t)
		cmd := exec.CommandContext(t.Context(), binary, "--schema", f.schema, "console", "--listen", "127.0.0.1:0", "--read-only")
		cmd.Env = append(cmd.Environ(), "PGONCE_DATABASE_URL="+pgoncetest.DatabaseURL(t))
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		line, err := bufio.NewReader(stdout).ReadString('\n')
		require.NoError(t, err)
		_, rest, ok := strings.Cut(line, "http://")
		require.True(t, ok, line)
		base := "http://" + strings.Fields(rest)[0]

		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, base+"keys/"+string(review), nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		page, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Contains(t, string(page), "needs_review")
		require.Contains(t, string(page), "read-only")
	})
}
