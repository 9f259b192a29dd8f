package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

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

	t.Run("ServesOnLoopbackAndStopsOnSignal", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		review := f.needsReview(t)
		base := startConsole(t, nil, "--schema", f.schema, "console", "--listen", "127.0.0.1:0", "--read-only")
		status, page := httpGet(t, base+"keys/"+string(review), "")
		require.Equal(t, http.StatusOK, status)
		require.Contains(t, page, "needs_review")
		require.Contains(t, page, "read-only")
	})

	t.Run("TokenFromEnvironmentOffLoopback", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		base := startConsole(t, []string{"PGONCE_CONSOLE_TOKEN=s3cret"}, "--schema", f.schema, "console", "--listen", "0.0.0.0:0")
		status, _ := httpGet(t, base, "")
		require.Equal(t, http.StatusUnauthorized, status)
		status, page := httpGet(t, base, "s3cret")
		require.Equal(t, http.StatusOK, status, page)
		require.Contains(t, page, "Overview")
	})
}

// startConsole runs `pgonce ARGS` with env added, waits for the address it
// prints and returns its base URL on 127.0.0.1. When the test ends it
// interrupts the console and requires a clean exit.
func startConsole(t *testing.T, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(binary, args...) //nolint:gosec // the test's own binary
	cmd.Env = append(cmd.Environ(), "PGONCE_DATABASE_URL="+pgoncetest.DatabaseURL(t))
	cmd.Env = append(cmd.Env, env...)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	t.Cleanup(func() {
		require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
		select {
		case err := <-exited:
			require.NoError(t, err, "the console stops cleanly on SIGTERM")
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			require.FailNow(t, "the console did not stop on SIGTERM")
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	go func() {
		_, _ = io.Copy(io.Discard, stdout)
		exited <- cmd.Wait()
	}()
	require.NoError(t, err)
	_, rest, ok := strings.Cut(line, "http://")
	require.True(t, ok, line)
	addr := strings.TrimSuffix(strings.Fields(rest)[0], "/")
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err, addr)
	return "http://127.0.0.1:" + port + "/"
}

func httpGet(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	page, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return resp.StatusCode, string(page)
}
