package faults_test

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/faults"
	"github.com/pgonce/pgonce/outbox"
)

// awaitHealthy waits until pool answers again after a restart.
func awaitHealthy(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		return pool.Ping(ctx) == nil
	}, time.Minute, 20*time.Millisecond)
}

// waiters runs Client.Wait on keys while faults happen: every wait must end
// with the key's terminal result, never with an error, while its context
// (timeout long, defaulting to 2 minutes) is live.
type waiters struct {
	timeout time.Duration

	wg   sync.WaitGroup
	mu   sync.Mutex
	n    int
	errs []error
}

func (w *waiters) wait(client *outbox.Client[pgx.Tx], key outbox.Key) {
	w.mu.Lock()
	w.n++
	w.mu.Unlock()
	w.wg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cmp.Or(w.timeout, 2*time.Minute))
		defer cancel()
		start := time.Now()
		res, err := client.Wait(ctx, key)
		if err == nil && res.State.InProgress() {
			err = fmt.Errorf("wait returned %s", res.State)
		}
		if err != nil {
			w.mu.Lock()
			w.errs = append(w.errs, fmt.Errorf("wait %s (after %s): %w", key, time.Since(start).Round(time.Millisecond), err))
			w.mu.Unlock()
		}
	})
}

// require waits for every wait, counts them in the tally and fails t on any
// that did not return the terminal result.
func (w *waiters) require(t *testing.T, msg string) {
	t.Helper()
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	tally.Waits(w.n, len(w.errs))
	require.Empty(t, w.errs, msg)
}

// TestRestart restarts a private PostgreSQL cluster under load, with
// pg_ctlcluster's fast and immediate shutdown modes: the workers lose every
// connection, in-flight statements and (immediate) anything not yet
// flushed is recovered from the WAL.
func TestRestart(t *testing.T) {
	t.Parallel()
	cluster := faults.NewCluster(t, nil)
	restarts := faults.Scale(1, 5)

	for _, mode := range []string{"fast", "immediate"} {
		t.Run(mode, func(t *testing.T) {
			b := setup(t, &bundleOpts{cluster: cluster, latency: 2 * time.Millisecond})
			// Keys waited on across the first restart: no dispatcher runs
			// until it is over, so the waits poll a restarting server.
			var waits waiters
			for range 6 {
				if key, fate := b.load.SubmitOne(t.Context()); fate == faults.FateCommitted {
					waits.wait(b.client, key)
				}
			}
			time.Sleep(200 * time.Millisecond)
			cluster.Restart(mode)
			tally.Fault("restart_" + mode)
			stopSubmit := b.submit(t, 2, 5*time.Millisecond)
			stopDispatch := b.runDispatcher(t)
			stopReconcile := b.runReconciler(t)
			for range restarts {
				time.Sleep(500 * time.Millisecond)
				cluster.Restart(mode)
				tally.Fault("restart_" + mode)
			}
			time.Sleep(500 * time.Millisecond)
			stopSubmit()
			stopDispatch()
			stopReconcile()
			awaitHealthy(t, b.direct)
			b.finish(t, faults.CheckOpts{})
			waits.require(t, "Client.Wait must outlast a restart of the server")
		})
	}
}
