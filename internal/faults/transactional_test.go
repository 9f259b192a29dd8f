package faults_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/faults"
	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/reconcile"
)

// txBundle is a campaign of a transactional tool, "credit", whose effect is
// a row of faults_tx_effect written in the attempt's transaction: its
// workers' connections (application_name app) are the ones faults end,
// and direct is the checker's own.
type txBundle struct {
	schema string
	app    string
	direct *pgxpool.Pool
	client *outbox.Client[pgx.Tx]
	// checker is a client over direct: it submits, and reads outcomes,
	// out of the faults' way.
	checker *outbox.Client[pgx.Tx]
	keys    []outbox.Key
}

// setupTx makes a transactional campaign; hold, when set, runs in the
// provider's transaction after its effect.
func setupTx(t *testing.T, hold func(ctx context.Context, tx pgx.Tx)) *txBundle {
	t.Helper()
	ctx := t.Context()
	schema := pgoncetest.Schema(t)
	direct := pgoncetest.Pool(t)
	table := ident.Quote(schema) + ".faults_tx_effect"
	_, err := direct.Exec(ctx, "CREATE TABLE "+table+" (id bigserial PRIMARY KEY, key text NOT NULL, attempt integer NOT NULL)")
	require.NoError(t, err)
	app := "faults_" + schema
	workers, err := faults.NewPool(ctx, pgoncetest.DatabaseURL(t), app)
	require.NoError(t, err)
	t.Cleanup(workers.Close)
	credit := outbox.TxProviderFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, req outbox.Request) (json.RawMessage, error) {
		if _, err := tx.Exec(ctx, "INSERT INTO "+table+" (key, attempt) VALUES ($1, $2)", string(req.Key), req.Attempt); err != nil {
			return nil, err
		}
		if hold != nil {
			hold(ctx, tx)
		}
		return fmt.Appendf(nil, `{"credited":%q,"attempt":%d}`, req.Key, req.Attempt), nil
	})
	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("credit", credit, outbox.Transactional))
	client, err := outbox.NewPgx(workers, clientConfig(schema, registry))
	require.NoError(t, err)
	checker, err := outbox.NewPgx(direct, clientConfig(schema, registry))
	require.NoError(t, err)
	return &txBundle{schema: schema, app: app, direct: direct, client: client, checker: checker}
}

func (b *txBundle) submit(t *testing.T, n int) {
	t.Helper()
	for range n {
		step := int64(len(b.keys) + 1)
		res, err := b.checker.Submit(t.Context(), outbox.Call{RunID: "run", Step: step, Tool: "credit", Args: map[string]any{"step": step}})
		require.NoError(t, err)
		b.keys = append(b.keys, res.Key)
	}
}

func (b *txBundle) runDispatcher(t *testing.T) (stop func()) {
	t.Helper()
	d, err := dispatcher.New(b.client, dispatcherConfig())
	require.NoError(t, err)
	return background(t, "Dispatcher.Run", func(ctx context.Context) { _ = d.Run(ctx) })
}

func (b *txBundle) runReconciler(t *testing.T) (stop func()) {
	t.Helper()
	r, err := reconcile.New(b.client, reconcile.Config{Grace: grace})
	require.NoError(t, err)
	return background(t, "Reconciler.Run", func(ctx context.Context) { _ = r.Run(ctx, 100*time.Millisecond) })
}

// finish runs a dispatcher and a reconciler until every submitted key is
// final, and checks the promise: every key succeeded, none went to review,
// and each wrote exactly one effect row, whose attempt is the one its
// stored response names.
func (b *txBundle) finish(t *testing.T) {
	t.Helper()
	stopD := b.runDispatcher(t)
	stopR := b.runReconciler(t)
	ctx, cancel := context.WithTimeout(t.Context(), faults.Scale(45*time.Second, 3*time.Minute))
	defer cancel()
	open, err := faults.AwaitTerminal(ctx, b.direct, b.schema, b.keys)
	stopD()
	stopR()
	require.NoError(t, err, "%d keys did not finish", open)
	rows, err := b.direct.Query(t.Context(), `
		SELECT e.key, count(*), min(e.attempt)
		FROM `+ident.Quote(b.schema)+`.faults_tx_effect AS e GROUP BY e.key`)
	require.NoError(t, err)
	effects := map[string][2]int{}
	for rows.Next() {
		var key string
		var n, attempt int
		require.NoError(t, rows.Scan(&key, &n, &attempt))
		effects[key] = [2]int{n, attempt}
	}
	require.NoError(t, rows.Err())
	for _, key := range b.keys {
		res, err := b.checker.Get(t.Context(), key)
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, res.State, "key %s: %s", key, res.LastError)
		require.Equal(t, 1, effects[string(key)][0], "key %s: one effect row per call", key)
		var resp struct{ Attempt int }
		require.NoError(t, json.Unmarshal(res.Response, &resp))
		require.Equal(t, effects[string(key)][1], resp.Attempt, "key %s: the stored response is its effect's", key)
	}
	tally.Asks(len(b.keys))
}

// TestTransactionalFaults ends a transactional tool's connections in the
// middle of its transaction, in the middle of its COMMIT, and at random
// under load, and counts its effects: exactly one row per call.
func TestTransactionalFaults(t *testing.T) {
	t.Parallel()
	const calls = 16

	t.Run("KilledMidTransaction", func(t *testing.T) {
		t.Parallel()
		g := newGate()
		b := setupTx(t, func(ctx context.Context, _ pgx.Tx) { g.hold(ctx, outbox.Request{}) })
		b.submit(t, calls)
		stop := b.runDispatcher(t)
		// Providers have written their effects and hold their
		// transactions: every worker connection is ended under them.
		g.await(t, 4)
		n, err := faults.KillBackends(t.Context(), b.direct, b.app, "")
		require.NoError(t, err)
		require.Positive(t, n)
		tally.Faults("tx_kill_mid_transaction", n)
		close(g.open)
		stop()
		b.finish(t)
	})

	t.Run("KilledMidCommit", func(t *testing.T) {
		t.Parallel()
		b := setupTx(t, nil)
		// A deferred constraint trigger makes each COMMIT wait for an
		// advisory lock that the test holds: the COMMIT is running when
		// its connection is ended.
		table := ident.Quote(b.schema) + ".faults_tx_effect"
		lockID := mathrand.Int64()
		_, err := b.direct.Exec(t.Context(), fmt.Sprintf(`
			CREATE FUNCTION %[1]s.faults_hold_commit() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN
				PERFORM pg_advisory_xact_lock_shared(%[2]d);
				RETURN NULL;
			END $$;
			CREATE CONSTRAINT TRIGGER faults_hold_commit AFTER INSERT ON %[3]s
				DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION %[1]s.faults_hold_commit();`,
			ident.Quote(b.schema), lockID, table))
		require.NoError(t, err)
		lock, err := b.direct.Begin(t.Context())
		require.NoError(t, err)
		defer func() { _ = lock.Rollback(context.WithoutCancel(t.Context())) }()
		_, err = lock.Exec(t.Context(), "SELECT pg_advisory_xact_lock($1)", lockID)
		require.NoError(t, err)

		b.submit(t, calls)
		stop := b.runDispatcher(t)
		for range 3 {
			pid, err := faults.AwaitBlocked(t.Context(), b.direct, b.app, "commit")
			require.NoError(t, err)
			require.NoError(t, faults.TerminateBackend(t.Context(), b.direct, pid))
			require.NoError(t, faults.AwaitGone(t.Context(), b.direct, pid))
			tally.Fault("tx_kill_mid_commit")
		}
		require.NoError(t, lock.Commit(t.Context()))
		stop()
		b.finish(t)
	})

	t.Run("AtRandomUnderLoad", func(t *testing.T) {
		t.Parallel()
		b := setupTx(t, nil)
		stopD := b.runDispatcher(t)
		stopR := b.runReconciler(t)
		deadline := time.Now().Add(faults.Scale(3*time.Second, 60*time.Second))
		kills := 0
		for time.Now().Before(deadline) || kills < 3 {
			b.submit(t, 1)
			// Do runs some calls inline, under the same faults.
			if len(b.keys)%3 == 0 {
				_, _ = b.client.Do(t.Context(), outbox.Call{RunID: "run-do", Step: int64(len(b.keys)), Tool: "credit", Args: map[string]any{}}, nil)
			}
			what, err := faults.KillAnyBackend(t.Context(), b.direct, b.app)
			require.NoError(t, err)
			if what != "" {
				kills++
				tally.Fault("tx_kill_any_" + what)
			}
		}
		stopD()
		stopR()
		// A Do whose submit the faults cut off before it committed made
		// no key; every other is checked.
		submitted := int64(len(b.keys))
		for step := int64(3); step <= submitted; step += 3 {
			key, err := outbox.DeriveKey(outbox.Call{RunID: "run-do", Step: step, Tool: "credit", Args: map[string]any{}})
			require.NoError(t, err)
			if _, err := b.checker.Get(t.Context(), key); !errors.Is(err, outbox.ErrNotFound) {
				require.NoError(t, err)
				b.keys = append(b.keys, key)
			}
		}
		b.finish(t)
	})
}
