package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRunRefusesBadInputWithExit2(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	invalid := filepath.Join(dir, "invalid.json")
	require.NoError(t, os.WriteFile(invalid, []byte(`{"upstream": {"command": "x"}, "tools": {"t": {"delivery": "twice"}}}`), 0o600))
	noURL := filepath.Join(dir, "no-url.json")
	require.NoError(t, os.WriteFile(noURL, []byte(`{"upstream": {"command": "x"}, "database_url_env": "PGONCE_TEST_PROXY_UNSET_VARIABLE"}`), 0o600))

	for _, tt := range []struct {
		name string
		args []string
		says string
	}{
		{"NoConfig", nil, "-config is required"},
		{"AnUnknownFlag", []string{"-nope"}, "flag provided but not defined"},
		{"AnArgument", []string{"-config", invalid, "extra"}, "unexpected arguments"},
		{"ABadLogLevel", []string{"-config", invalid, "-log-level", "loud"}, "-log-level"},
		{"AMissingFile", []string{"-config", filepath.Join(dir, "missing.json")}, "invalid MCP proxy config"},
		{"AnInvalidFile", []string{"-config", invalid}, `"twice"`},
		{"NoDatabaseURL", []string{"-config", noURL}, "$PGONCE_TEST_PROXY_UNSET_VARIABLE"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), tt.args, strings.NewReader(""), &stdout, &stderr)
			require.Equal(t, exitUsage, code, stderr.String())
			require.Contains(t, stderr.String(), tt.says)
			require.Empty(t, stdout.String(), "standard output is the MCP channel")
		})
	}
}
