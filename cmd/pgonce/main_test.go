package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

// binary is the pgonce command built once for the tests of this package.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "pgonce-cli-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "pgonce")
	build := exec.Command("go", "build", "-o", binary, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build pgonce:", err)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	pgoncetest.Main(m)
}

type cliResult struct {
	code           int
	stdout, stderr string
}

// pgonceEnv runs the binary with env added to a copy of the environment
// from which the connection variables are removed.
func pgonceEnv(t *testing.T, env []string, args ...string) cliResult {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), binary, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PGONCE_DATABASE_URL=") && !strings.HasPrefix(kv, "DATABASE_URL=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		code = exitErr.ExitCode()
	} else {
		require.NoError(t, err)
	}
	require.NotContains(t, stderr.String(), "goroutine ", "no stack trace for a user")
	return cliResult{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// pgonce runs the binary against the test database.
func pgonce(t *testing.T, args ...string) cliResult {
	t.Helper()
	return pgonceEnv(t, []string{"PGONCE_DATABASE_URL=" + pgoncetest.DatabaseURL(t)}, args...)
}

// fixture is a migrated schema with a client whose registry knows the
// tools the tests use.
type fixture struct {
	schema string
	client *outbox.Client[pgx.Tx]
	seq    int
}

type lookupProvider struct{}

func (lookupProvider) Call(context.Context, outbox.Request) (json.RawMessage, error) {
	return json.RawMessage(`{}`), nil
}

func (lookupProvider) Lookup(context.Context, outbox.Request) (json.RawMessage, bool, error) {
	return nil, false, nil
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	schema := pgoncetest.Schema(t)
	ok := outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
		return json.RawMessage(`{}`), nil
	})
	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("refund", ok, outbox.IdempotentByKey))
	require.NoError(t, registry.Register("email", ok, outbox.AtMostOnce))
	require.NoError(t, registry.Register("provision", lookupProvider{}, outbox.LookupByNaturalID))
	client, err := outbox.NewPgx(pgoncetest.Pool(t), outbox.Config{Schema: schema, Registry: registry})
	require.NoError(t, err)
	return &fixture{schema: schema, client: client}
}

func (f *fixture) call(tool string) outbox.Call {
	f.seq++
	return outbox.Call{RunID: "cli-test", Step: int64(f.seq), Tool: tool, NaturalID: fmt.Sprint("n", f.seq), Args: map[string]any{"i": f.seq}}
}

// succeeded makes a succeeded key whose stored response is resp.
func (f *fixture) succeeded(t *testing.T, tool string, resp string) outbox.Key {
	t.Helper()
	res, err := f.client.Do(t.Context(), f.call(tool), outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
		return json.RawMessage(resp), nil
	}))
	require.NoError(t, err)
	require.Equal(t, outbox.StateSucceeded, res.State)
	return res.Key
}

// needsReview makes an email key whose attempt timed out.
func (f *fixture) needsReview(t *testing.T) outbox.Key {
	t.Helper()
	res, err := f.client.Do(t.Context(), f.call("email"), outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
		return nil, outbox.Ambiguous(errors.New("timeout"))
	}))
	require.NoError(t, err)
	require.Equal(t, outbox.StateNeedsReview, res.State)
	return res.Key
}

// pending submits a key and backdates it, so it waited an hour.
func (f *fixture) pending(t *testing.T, tool string) outbox.Key {
	t.Helper()
	res, err := f.client.Submit(t.Context(), f.call(tool))
	require.NoError(t, err)
	f.exec(t, `UPDATE pgonce_key SET available_at = now() - interval '1 hour' WHERE key = $1`, pgoncetest.StoredKey(t, string(res.Key)))
	return res.Key
}

// crashed submits a key and leaves it in flight under a lease that ended an
// hour ago, as a crashed worker would.
func (f *fixture) crashed(t *testing.T, tool string) outbox.Key {
	t.Helper()
	res, err := f.client.Submit(t.Context(), f.call(tool))
	require.NoError(t, err)
	f.exec(t, `UPDATE pgonce_key SET attempt = attempt + 1, worker = 'crashed',
		lease_until = now() - interval '1 hour', first_attempted_at = now() - interval '2 hours' WHERE key = $1`, pgoncetest.StoredKey(t, string(res.Key)))
	return res.Key
}

// exec runs SQL with the schema on the search_path.
func (f *fixture) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	tx, err := pgoncetest.Pool(t).Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(t.Context())) }()
	_, err = tx.Exec(t.Context(), "SET LOCAL search_path TO "+pgx.Identifier{f.schema}.Sanitize())
	require.NoError(t, err)
	_, err = tx.Exec(t.Context(), sql, args...)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(t.Context()))
}

func decodeJSON(t *testing.T, text string) map[string]any {
	t.Helper()
	var v map[string]any
	require.NoError(t, json.Unmarshal([]byte(text), &v), text)
	return v
}
