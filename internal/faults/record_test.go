package faults_test

import (
	"context"
	mathrand "math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/faults"
	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

// TestRecordThroughFaults makes the record of known outcomes meet faults
// that last: an outage longer than the lease, a link so slow that a huge
// outcome takes longer than the lease to send, and database/sql connections
// killed again and again while a dispatcher records.
func TestRecordThroughFaults(t *testing.T) {
	t.Parallel()

	// Providers answer while the network to the database is gone, for
	// longer than the lease and less than lease and grace: their outcomes
	// are known and must be recorded once it is back, not sent to review.
	t.Run("OutageLongerThanTheLease", func(t *testing.T) {
		t.Parallel()
		g := newGate()
		url := pgoncetest.DatabaseURL(t)
		proxy, err := faults.NewProxy(hostPort(t, url))
		require.NoError(t, err)
		proxyURL, err := proxy.URL(url)
		require.NoError(t, err)
		// A grace long enough that the reconciler cannot take the keys
		// over before the outage ends, connect timeouts included.
		b := setup(t, &bundleOpts{databaseURL: proxyURL, hold: g.hold, grace: 15 * time.Second})
		t.Cleanup(func() { _ = proxy.Close() })
		for range faults.Scale(12, 48) {
			b.load.SubmitOne(t.Context())
		}
		stopDispatch := b.runDispatcher(t)
		stopReconcile := b.runReconciler(t)
		g.await(t, 4)
		proxy.BlackHole()
		proxy.Reset()
		close(g.open)
		time.Sleep(lease + time.Second) // the outage outlasts the lease
		proxy.Heal()
		// The connections that fell into the black hole stay there.
		proxy.Reset()
		tally.Fault("proxy_outage_past_lease")
		stopDispatch()
		stopReconcile()
		b.finish(t, faults.CheckOpts{})
	})

	// At-most-once calls answer while the workers' network to the database
	// is gone for longer than lease and grace, and a reconciler that still
	// reaches the database takes their keys over and sends them to review
	// for want of their outcome: once the network is back, the outcomes
	// the workers hold settle those reviews.
	t.Run("OutageLongerThanLeaseAndGrace", func(t *testing.T) {
		t.Parallel()
		g := newGate()
		url := pgoncetest.DatabaseURL(t)
		proxy, err := faults.NewProxy(hostPort(t, url))
		require.NoError(t, err)
		proxyURL, err := proxy.URL(url)
		require.NoError(t, err)
		// The first attempts of at-most-once calls answer once the outage
		// began, whatever their deadline: their provider acted and
		// answered, and only their record is late.
		hold := func(_ context.Context, req outbox.Request) {
			if req.Tool != faults.ToolOnce || req.Attempt != 1 {
				return
			}
			select {
			case g.held <- struct{}{}:
			default:
			}
			<-g.open
		}
		b := setup(t, &bundleOpts{databaseURL: proxyURL, hold: hold})
		t.Cleanup(func() { _ = proxy.Close() })
		for range faults.Scale(12, 48) {
			b.load.SubmitOne(t.Context())
		}
		stopDispatch := b.runDispatcher(t)
		_, reconcileDirect := runners(t, b.checker, b.grace)
		stopReconcile := background(t, "Reconciler.Run", func(ctx context.Context) { _ = reconcileDirect(ctx) })
		g.await(t, 2)
		proxy.BlackHole()
		proxy.Reset()
		close(g.open)
		// The reconciler has taken every held key over and sent it to
		// review before the network is back.
		reviewed := awaitCount(t, b, `SELECT count(*) FROM `+ident.Quote(b.schema)+`.pgonce_key
			WHERE state = 'needs_review' AND attempt = 2`, 2)
		proxy.Heal()
		// The connections that fell into the black hole stay there.
		proxy.Reset()
		tally.Fault("proxy_outage_past_grace")
		stopDispatch() // after the records of the held outcomes
		stopReconcile()
		b.finish(t, faults.CheckOpts{})
		var settled int
		require.NoError(t, b.direct.QueryRow(t.Context(), `SELECT count(*) FROM `+ident.Quote(b.schema)+
			`.pgonce_resolution WHERE resolved_by = 'pgonce'`).Scan(&settled))
		require.Positive(t, settled, "of %d reviews, the late outcomes settled none", reviewed)
	})

	// Some calls answer several megabytes over a link so slow
	// that its record takes longer than lease and grace: the outcomes that
	// finished with it must not wait for it, and its own must be recorded.
	t.Run("SlowHugeOutcome", func(t *testing.T) {
		t.Parallel()
		url := pgoncetest.DatabaseURL(t)
		proxy, err := faults.NewProxy(hostPort(t, url))
		require.NoError(t, err)
		proxyURL, err := proxy.URL(url)
		require.NoError(t, err)
		huge := func(req outbox.Request) faults.Mode {
			// At-most-once calls, which nothing but their record can
			// settle: one in two of them, so that others finish beside.
			if req.Attempt == 1 && req.Tool == faults.ToolOnce && strings.IndexAny(req.NaturalID[len(req.NaturalID)-1:], "13579") == 0 {
				tally.Fault("slow_huge_outcome")
				return faults.ModeHugeBody
			}
			return faults.ModeReturn
		}
		// Writing a huge effect to the ledger takes the provider more than
		// the campaign's call timeout under the race detector.
		const callTimeout, lease = 3 * time.Second, 4 * time.Second
		// The default StatementTimeout, 5s, is less than the link needs to
		// send a huge outcome: the statement that records one has a
		// deadline that grows with its size.
		b := setup(t, &bundleOpts{
			databaseURL: proxyURL, latency: 2 * time.Millisecond, mode: huge,
			callTimeout: callTimeout, lease: lease,
		})
		t.Cleanup(func() { _ = proxy.Close() })
		// About 7s to send a huge outcome: past lease and grace (5s).
		proxy.Throttle(faults.HugeBodySize / 7)
		for range faults.Scale(24, 96) {
			b.load.SubmitOne(t.Context())
		}
		stopDispatch := b.runDispatcher(t)
		stopReconcile := b.runReconciler(t)
		// Every committed call is terminal before the link is healed: the
		// huge outcomes too were recorded over the slow link.
		ctx, cancel := context.WithTimeout(t.Context(), faults.Scale(45*time.Second, 3*time.Minute))
		defer cancel()
		open, err := faults.AwaitTerminal(ctx, b.direct, b.schema, b.history.Keys())
		require.NoError(t, err, "%d committed calls did not finish over the slow link", open)
		stopDispatch()
		stopReconcile()
		proxy.Throttle(0)
		b.finish(t, faults.CheckOpts{})
	})

	// Every backend of a database/sql dispatcher, its reconciler and its
	// submitters is terminated every 20 to 120 ms, so that statements,
	// records among them, meet connections that database/sql reports as
	// bad.
	t.Run("DatabaseSQLConnectionKills", func(t *testing.T) {
		t.Parallel()
		b := setup(t, &bundleOpts{driver: driverStd, latency: 2 * time.Millisecond})
		stopSubmit := b.submit(t, 2, 5*time.Millisecond)
		stopDispatch := b.runDispatcher(t)
		stopReconcile := b.runReconciler(t)
		deadline := time.Now().Add(faults.Scale(4*time.Second, 60*time.Second))
		killed := 0
		for time.Now().Before(deadline) {
			time.Sleep(time.Duration(20+mathrand.IntN(100)) * time.Millisecond)
			n, err := faults.KillBackends(t.Context(), b.direct, b.app, "")
			require.NoError(t, err)
			killed += n
		}
		tally.Faults("kill_backends_std", killed)
		t.Logf("killed %d backends", killed)
		stopSubmit()
		stopDispatch()
		stopReconcile()
		b.finish(t, faults.CheckOpts{})
	})
}

// awaitCount waits until query, a count on b's direct pool, reaches at
// least n, and returns it; it fails t if it has not within commitTimeout.
func awaitCount(t *testing.T, b *bundle, query string, n int) int {
	t.Helper()
	deadline := time.Now().Add(commitTimeout)
	for {
		var got int
		require.NoError(t, b.direct.QueryRow(t.Context(), query).Scan(&got))
		if got >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d within %s: %s", got, n, commitTimeout, query)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
