package main

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
)

var update = flag.Bool("update", false, "rewrite testdata/demo.golden")

func TestDemo(t *testing.T) {
	t.Parallel()

	t.Run("MatchesTheGoldenFile", func(t *testing.T) {
		t.Parallel()
		res := pgonce(t, "demo")
		require.Equal(t, exitOK, res.code, "stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
		require.Empty(t, res.stderr)
		golden := filepath.Join("testdata", "demo.golden")
		if *update {
			require.NoError(t, os.WriteFile(golden, []byte(res.stdout), 0o600))
		}
		want, err := os.ReadFile(golden)
		require.NoError(t, err)
		require.Equal(t, string(want), res.stdout)
	})

	t.Run("KeepKeepsTheSchemaAndItsLedger", func(t *testing.T) {
		t.Parallel()
		res := pgonce(t, "demo", "--keep")
		require.Equal(t, exitOK, res.code, res.stderr)
		_, after, found := strings.Cut(res.stdout, "kept schema ")
		require.True(t, found, res.stdout)
		schema, _, _ := strings.Cut(after, ";")
		require.True(t, strings.HasPrefix(schema, "pgonce_demo_"), schema)
		t.Cleanup(func() { pgoncetest.DropSchema(t, schema) })

		var ledger, exists int
		pool := pgoncetest.Pool(t)
		require.NoError(t, pool.QueryRow(t.Context(),
			`SELECT count(*) FROM pg_namespace WHERE nspname = $1`, schema).Scan(&exists))
		require.Equal(t, 1, exists)
		require.NoError(t, pool.QueryRow(t.Context(),
			`SELECT count(*) FROM `+schema+`.refund_ledger`).Scan(&ledger))
		require.Equal(t, 1, ledger)
	})

	t.Run("TraceShowsTheRefundsPath", func(t *testing.T) {
		t.Parallel()
		res := pgonce(t, "demo", "--trace")
		require.Equal(t, exitOK, res.code, "stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
		require.Empty(t, res.stderr)
		_, tree, found := strings.Cut(res.stdout, "under the submit they link to.\n\n")
		require.True(t, found, res.stdout)
		// The first attempt is cut off by the crash: ambiguous, and never
		// recorded. The reconciler's requeue is attempt 2, the retry 3.
		require.Equal(t, `agent run-8842
├─ model asks refund
│  └─ send refund  outcome=created
│     ├─ claim (linked)  keys=1
│     ├─ process refund  attempt=1 outcome=ambiguous error
│     ├─ claim (linked)  keys=1
│     ├─ process refund  attempt=3 outcome=succeeded
│     └─ record (linked)  keys=1
├─ model asks refund
│  └─ send refund  outcome=in_progress
├─ reconcile  examined=1
└─ model asks refund
   └─ send refund  outcome=replayed
`, tree)
	})

	t.Run("UnreachableDatabase", func(t *testing.T) {
		t.Parallel()
		res := pgonceEnv(t, []string{"PGONCE_DATABASE_URL=postgres://postgres@127.0.0.1:1/postgres"}, "demo")
		require.Equal(t, exitFailure, res.code)
		require.Contains(t, res.stderr, "cannot reach PostgreSQL")
	})
}
