package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
)

// TestPoolingTransaction runs the operator commands through PgBouncer in
// transaction mode (the test process's own, in front of the test
// database), as an operator whose services sit behind one would: with
// --pooling transaction or $PGONCE_POOLING they read and change keys there,
// and migrate refuses, since goose's session lock needs a direct
// connection.
func TestPoolingTransaction(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	review := f.needsReview(t)
	done := f.succeeded(t, "refund", `{"id":"re_1"}`)
	// The URL an operator has: the pooler's, with no exec mode of its own
	// (--pooling transaction chooses one that prepares nothing).
	url := strings.Replace(pgoncetest.PooledURL(t), "&default_query_exec_mode=exec", "", 1)
	require.NotContains(t, url, "default_query_exec_mode")
	pooled := []string{"PGONCE_DATABASE_URL=" + url}
	viaFlag := func(args ...string) cliResult {
		return pgonceEnv(t, pooled, append([]string{"--schema", f.schema, "--pooling", "transaction"}, args...)...)
	}

	res := viaFlag("status")
	require.Equal(t, exitOK, res.code, res.stderr)
	require.Contains(t, res.stdout, "needs review")

	res = viaFlag("inspect", string(done))
	require.Equal(t, exitOK, res.code, res.stderr)
	require.Contains(t, res.stdout, `{"id":"re_1"}`)

	res = viaFlag("list", "--state", "needs_review")
	require.Equal(t, exitOK, res.code, res.stderr)
	require.Contains(t, res.stdout, string(review))

	// The same through the environment, for a change: the resolve is
	// written through the pooler, and read back directly.
	res = pgonceEnv(t, append(pooled, "PGONCE_POOLING=transaction"), "--schema", f.schema,
		"resolve", string(review), "--failed", "--failure", `{"error":"bounced"}`, "--reason", "bounced", "--by", "ops")
	require.Equal(t, exitOK, res.code, res.stderr)
	got, err := f.client.Get(t.Context(), review)
	require.NoError(t, err)
	require.Equal(t, "failed", string(got.State))

	res = viaFlag("migrate", "up")
	require.Equal(t, exitUsage, res.code, res.stdout)
	require.Contains(t, res.stderr, "migrate needs a direct connection")

	res = pgonceEnv(t, pooled, "--schema", f.schema, "--pooling", "statement", "status")
	require.Equal(t, exitUsage, res.code)
	require.Contains(t, res.stderr, `"statement" is not a pooling mode`)
}
