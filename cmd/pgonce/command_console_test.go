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

	t.Run("RefusesShortToken", func(t *testing.T) {
		t.Parallel()
		for _, env := range [][]string{{"PGONCE_CONSOLE_TOKEN=s3cret"}, {"PGONCE_CONSOLE_TOKEN="}} {
			args := []string{"console", "--listen", "127.0.0.1:0"}
			if env[0] == "PGONCE_CONSOLE_TOKEN=" {
				args = append(args, "--token", "0123456789abcde") // 15 bytes
			}
			res := pgonceEnv(t, env, args...)
			require.Equal(t, exitUsage, res.code, res.stderr)
			require.Contains(t, res.stderr, "too short")
			require.Contains(t, res.stderr, "at least 16")
			require.Empty(t, res.stdout, "nothing was served")
		}
	})

	t.Run("GeneratesATokenOffLoopbackAndPrintsItOnce", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		base, lines := startConsoleLines(t, []string{"PGONCE_CONSOLE_TOKEN="}, 3, "--schema", f.schema, "console", "--listen", "0.0.0.0:0", "--secure-cookie")
		token, ok := strings.CutPrefix(lines[1], "token (generated, shown once): ")
		require.True(t, ok, lines[1])
		require.Len(t, token, 32)
		require.Contains(t, lines[2], "/?token="+token)
		status, page := httpGet(t, base, "")
		require.Equal(t, http.StatusUnauthorized, status)
		require.NotContains(t, page, f.schema, "no schema for a client without the token")
		status, page = httpGet(t, base, token)
		require.Equal(t, http.StatusOK, status, page)
		require.Contains(t, page, "Overview")

		// The token is traded for a Secure session cookie that is not the
		// token.
		client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, base+"?token="+token, nil)
		require.NoError(t, err)
		resp, err := client.Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusSeeOther, resp.StatusCode)
		cookies := resp.Cookies()
		require.NotEmpty(t, cookies)
		for _, c := range cookies {
			require.True(t, c.Secure, c.Name)
			require.NotContains(t, c.Value, token)
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
		base := startConsole(t, []string{"PGONCE_CONSOLE_TOKEN=s3cret-but-16-bytes-or-more"}, "--schema", f.schema, "console", "--listen", "0.0.0.0:0")
		status, _ := httpGet(t, base, "")
		require.Equal(t, http.StatusUnauthorized, status)
		status, page := httpGet(t, base, "s3cret-but-16-bytes-or-more")
		require.Equal(t, http.StatusOK, status, page)
		require.Contains(t, page, "Overview")
	})
}

// startConsole runs `pgonce ARGS` with env added, waits for the address it
// prints and returns its base URL on 127.0.0.1. When the test ends it
// interrupts the console and requires a clean exit.
func startConsole(t *testing.T, env []string, args ...string) string {
	t.Helper()
	base, _ := startConsoleLines(t, env, 1, args...)
	return base
}

// startConsoleLines is startConsole that also returns the first n lines
// the console prints.
func startConsoleLines(t *testing.T, env []string, n int, args ...string) (string, []string) {
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
	reader := bufio.NewReader(stdout)
	var lines []string
	for range n {
		var line string
		if line, err = reader.ReadString('\n'); err != nil {
			break
		}
		lines = append(lines, strings.TrimSuffix(line, "\n"))
	}
	go func() {
		_, _ = io.Copy(io.Discard, reader)
		exited <- cmd.Wait()
	}()
	require.NoError(t, err)
	_, rest, ok := strings.Cut(lines[0], "http://")
	require.True(t, ok, lines[0])
	addr := strings.TrimSuffix(strings.Fields(rest)[0], "/")
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err, addr)
	return "http://127.0.0.1:" + port + "/", lines
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
