package faults_test

import (
	"context"
	mathrand "math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/faults"
	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/outbox"
)

// gate holds provider answers until it is opened.
type gate struct {
	held chan struct{}
	open chan struct{}
}

func newGate() *gate { return &gate{held: make(chan struct{}, 1024), open: make(chan struct{})} }

func (g *gate) hold(ctx context.Context, _ outbox.Request) {
	select {
	case g.held <- struct{}{}:
	default:
	}
	select {
	case <-g.open:
	case <-ctx.Done():
	}
}

// await waits until n answers are held.
func (g *gate) await(t *testing.T, n int) {
	t.Helper()
	for range n {
		select {
		case <-g.held:
		case <-time.After(30 * time.Second):
			t.Fatalf("no provider call came to the gate")
		}
	}
}

// TestKillBackend ends the workers' PostgreSQL backends with
// pg_terminate_backend in the middle of a claim, of a provider call, and of
// the record of an outcome, and at random under continuous submission.
func TestKillBackend(t *testing.T) {
	t.Parallel()
	const calls = 24

	t.Run("MidClaim", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		for range calls {
			b.load.SubmitOne(t.Context())
		}
		// A table lock holds the claims in the middle of their statement.
		lock, err := b.direct.Begin(t.Context())
		require.NoError(t, err)
		defer func() { _ = lock.Rollback(context.WithoutCancel(t.Context())) }()
		_, err = lock.Exec(t.Context(), `LOCK TABLE `+ident.Quote(b.schema)+`.pgonce_key IN EXCLUSIVE MODE`)
		require.NoError(t, err)
		b.runDispatcher(t)
		for range 3 {
			pid, err := faults.AwaitBlocked(t.Context(), b.direct, b.app, "OutboxClaimBatch")
			require.NoError(t, err)
			require.NoError(t, faults.TerminateBackend(t.Context(), b.direct, pid))
			// Not to find the dying backend, still blocked, next time.
			require.NoError(t, faults.AwaitGone(t.Context(), b.direct, pid))
			tally.Fault("kill_backend_mid_claim")
		}
		require.NoError(t, lock.Commit(t.Context()))
		b.finish(t, faults.CheckOpts{})
	})

	t.Run("MidCall", func(t *testing.T) {
		t.Parallel()
		g := newGate()
		b := setup(t, &bundleOpts{hold: g.hold})
		for range calls {
			b.load.SubmitOne(t.Context())
		}
		b.runDispatcher(t)
		// Providers have acted and hold their answers: every connection of
		// the workers is ended under them, and then the answers go back.
		g.await(t, 4)
		n, err := faults.KillBackends(t.Context(), b.direct, b.app, "")
		require.NoError(t, err)
		require.Positive(t, n)
		tally.Faults("kill_backend_mid_call", n)
		close(g.open)
		b.finish(t, faults.CheckOpts{})
	})

	t.Run("MidRecord", func(t *testing.T) {
		t.Parallel()
		g := newGate()
		b := setup(t, &bundleOpts{hold: g.hold})
		for range calls {
			b.load.SubmitOne(t.Context())
		}
		b.runDispatcher(t)
		g.await(t, 4)
		// Row locks hold the record of the outcomes in the middle of its
		// statement; it is ended there.
		lock, err := b.direct.Begin(t.Context())
		require.NoError(t, err)
		defer func() { _ = lock.Rollback(context.WithoutCancel(t.Context())) }()
		_, err = lock.Exec(t.Context(), `SELECT FROM `+ident.Quote(b.schema)+`.pgonce_key FOR UPDATE`)
		require.NoError(t, err)
		close(g.open)
		pid, err := faults.AwaitBlocked(t.Context(), b.direct, b.app, "OutboxFinish")
		require.NoError(t, err)
		require.NoError(t, faults.TerminateBackend(t.Context(), b.direct, pid))
		tally.Fault("kill_backend_mid_record")
		require.NoError(t, lock.Commit(t.Context()))
		b.finish(t, faults.CheckOpts{})
	})

	// At random under load, through either driver, and with callers that
	// run their calls inline with Do.
	for _, tt := range campaignClients() {
		t.Run("AtRandomUnderLoad"+tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, &bundleOpts{driver: tt.driver, latency: 2 * time.Millisecond, mode: tt.mode})
			b.load.DoAsks = tt.doAsks
			stopSubmit := b.submit(t, 2, 5*time.Millisecond)
			stopDispatch := b.runDispatcher(t)
			stopReconcile := b.runReconciler(t)
			doing := map[string]int{}
			deadline := time.Now().Add(tt.length(4*time.Second, 60*time.Second))
			for time.Now().Before(deadline) {
				time.Sleep(time.Duration(10+mathrand.IntN(60)) * time.Millisecond)
				what, err := faults.KillAnyBackend(t.Context(), b.direct, b.app)
				require.NoError(t, err)
				if what != "" {
					doing[what]++
					tally.Fault("kill_backend" + tt.suffix)
				}
			}
			t.Logf("killed backends, by what they were doing: %v", doing)
			stopSubmit()
			stopDispatch()
			stopReconcile()
			b.finish(t, faults.CheckOpts{})
		})
	}
}
