package failover_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/faults"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/migrations"
	"github.com/pgonce/pgonce/oncetest"
	"github.com/pgonce/pgonce/outbox"
)

// countingProvider counts its calls and answers them.
type countingProvider struct{ calls atomic.Int64 }

func (p *countingProvider) Call(context.Context, outbox.Request) (json.RawMessage, error) {
	p.calls.Add(1)
	return json.RawMessage(`{"ok":true}`), nil
}

// TestReplicatedClaim runs against a server whose synchronous standby
// never connects (synchronous_standby_names = '*', none streaming) and
// whose commits wait for none by default (synchronous_commit = local): a
// commit that asks for remote_apply waits for good there. A claim of a tool
// registered with ReplicatedClaim must so wait, and its provider must not
// be called; a claim of any other tool commits at once.
func TestReplicatedClaim(t *testing.T) {
	t.Parallel()
	cluster := faults.NewCluster(t, nil)
	conf := filepath.Join("/etc/postgresql", cluster.Version, cluster.Name, "conf.d", "replicated.conf")
	require.NoError(t, os.WriteFile(conf, []byte("synchronous_standby_names = '*'\nsynchronous_commit = local\n"), 0o644)) //nolint:gosec // read by the postgres user
	// The settings take effect at a reload.
	out, err := exec.Command("pg_ctlcluster", cluster.Version, cluster.Name, "reload").CombinedOutput() //nolint:gosec // our own cluster
	require.NoError(t, err, "%s", out)

	type testBundle struct {
		pool       *pgxpool.Pool
		client     *outbox.Client[pgx.Tx]
		replicated *countingProvider
		plain      *countingProvider
	}
	setup := func(t *testing.T) *testBundle {
		t.Helper()
		ctx := t.Context()
		pool, err := faults.NewPool(ctx, cluster.URL(), "replicated_claim")
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		schema := pgoncetest.NewSchemaName(t)
		db := stdlib.OpenDBFromPool(pool)
		require.NoError(t, migrations.Up(ctx, db, schema))
		require.NoError(t, db.Close())
		b := &testBundle{pool: pool, replicated: &countingProvider{}, plain: &countingProvider{}}
		registry := outbox.NewRegistry()
		require.NoError(t, registry.RegisterWithOpts("refund", b.replicated, outbox.AtMostOnce, &outbox.ToolOpts{ReplicatedClaim: true}))
		require.NoError(t, registry.Register("email", b.plain, outbox.AtMostOnce))
		b.client, err = outbox.NewPgx(pool, outbox.Config{Schema: schema, Registry: registry, Logger: quietLogger()})
		require.NoError(t, err)
		return b
	}
	// awaitSyncRep waits until a statement named name waits for the standby
	// at its commit.
	awaitSyncRep := func(t *testing.T, b *testBundle, name string) {
		t.Helper()
		awaitCondition(t, name+" waiting for the synchronous standby", func(ctx context.Context) (bool, error) {
			var n int
			err := b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE wait_event = 'SyncRep' AND strpos(query, $1) > 0`, "-- name: "+name+" ").Scan(&n)
			return n > 0, err
		})
	}
	// background runs f in a goroutine whose context ends with the test.
	background := func(t *testing.T, f func(ctx context.Context)) {
		t.Helper()
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); f(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
	}
	call := func(tool string) outbox.Call {
		return outbox.Call{RunID: pgoncetest.NewSchemaName(t), Step: 1, Tool: tool, Args: map[string]any{"amount": "42.00"}}
	}

	t.Run("DoWaitsForTheStandbyBeforeTheProvider", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		background(t, func(ctx context.Context) { _, _ = b.client.Do(ctx, call("refund"), nil) })
		awaitSyncRep(t, b, "KeyInsert")
		require.Zero(t, b.replicated.calls.Load(), "the provider ran before its claim was replicated")
	})

	t.Run("DoOfASubmittedKeyWaitsForTheStandby", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := call("refund")
		// The submit itself waits for nobody: only claims do.
		res, err := b.client.Submit(t.Context(), c)
		require.NoError(t, err)
		require.True(t, res.Created)
		background(t, func(ctx context.Context) { _, _ = b.client.Do(ctx, c, nil) })
		awaitSyncRep(t, b, "OutboxClaimKey")
		require.Zero(t, b.replicated.calls.Load(), "the provider ran before its claim was replicated")
	})

	t.Run("DispatcherClaimWaitsForTheStandby", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.client.Submit(t.Context(), call("refund"))
		require.NoError(t, err)
		d, err := dispatcher.New(b.client, dispatcher.Config{ShutdownTimeout: -1})
		require.NoError(t, err)
		background(t, func(ctx context.Context) { _ = d.Run(ctx) })
		awaitSyncRep(t, b, "OutboxClaimBatch")
		require.Zero(t, b.replicated.calls.Load(), "the provider ran before its claim was replicated")
	})

	t.Run("DrainClaimWaitsForTheStandby", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.client.Submit(t.Context(), call("refund"))
		require.NoError(t, err)
		background(t, func(ctx context.Context) { _, _ = oncetest.Drain(ctx, b.client, nil) })
		awaitSyncRep(t, b, "OutboxClaimBatch")
		require.Zero(t, b.replicated.calls.Load(), "the provider ran before its claim was replicated")
	})

	t.Run("OtherToolsClaimAtOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		res, err := b.client.Do(ctx, call("email"), nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, res.State)

		submitted, err := b.client.Submit(ctx, call("email"))
		require.NoError(t, err)
		d, err := dispatcher.New(b.client, dispatcher.Config{ShutdownTimeout: -1})
		require.NoError(t, err)
		background(t, func(ctx context.Context) { _ = d.Run(ctx) })
		res, err = b.client.Wait(ctx, submitted.Key)
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, res.State)
		require.Equal(t, int64(2), b.plain.calls.Load())
	})

	t.Run("DrainClaimsOtherToolsAtOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		_, err := b.client.Submit(ctx, call("email"))
		require.NoError(t, err)
		drained, err := oncetest.Drain(ctx, b.client, nil)
		require.NoError(t, err)
		require.Equal(t, 1, drained.Succeeded)
		require.Equal(t, int64(1), b.plain.calls.Load())
	})
}
