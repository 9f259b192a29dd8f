package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMCPProxy(t *testing.T) {
	t.Parallel()

	t.Run("RunsPgonceMCPProxyFromThePathWithItsFlagsAndExitCode", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		fake := "#!/bin/sh\necho \"$@\"\nexit 3\n"
		require.NoError(t, os.WriteFile(filepath.Join(dir, "pgonce-mcp-proxy"), []byte(fake), 0o700)) //nolint:gosec // a program
		res := pgonceEnv(t, []string{"PATH=" + dir + string(os.PathListSeparator) + os.Getenv("PATH")},
			"mcp-proxy", "--config", "proxy.json", "--listen", "127.0.0.1:0")
		require.Equal(t, 3, res.code, res.stderr)
		require.Equal(t, "-config proxy.json -log-level info -listen 127.0.0.1:0\n", res.stdout)
	})

	t.Run("NotOnThePathSaysHowToInstallIt", func(t *testing.T) {
		t.Parallel()
		res := pgonceEnv(t, []string{"PATH=" + t.TempDir()}, "mcp-proxy", "--config", "proxy.json")
		require.Equal(t, exitFailure, res.code)
		require.Contains(t, res.stderr, mcpProxyInstall)
	})

	t.Run("NeedsAConfigFile", func(t *testing.T) {
		t.Parallel()
		res := pgonceEnv(t, nil, "mcp-proxy")
		require.Equal(t, exitUsage, res.code)
		require.Contains(t, res.stderr, "--config is required")
	})
}
