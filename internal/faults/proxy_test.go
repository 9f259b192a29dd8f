package faults_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/faults"
	"github.com/pgonce/pgonce/internal/pgoncetest"
)

// proxied returns a campaign whose workers reach the database through a
// fault-injecting proxy.
func proxied(t *testing.T) (*bundle, *faults.Proxy) {
	t.Helper()
	return proxiedClient(t, campaignClient{driver: driverPgx})
}

// proxiedClient is proxied with the workers using the library as c says.
func proxiedClient(t *testing.T, c campaignClient) (*bundle, *faults.Proxy) {
	t.Helper()
	url := pgoncetest.DatabaseURL(t)
	proxy, err := faults.NewProxy(hostPort(t, url))
	require.NoError(t, err)
	proxyURL, err := proxy.URL(url)
	require.NoError(t, err)
	b := setup(t, &bundleOpts{databaseURL: proxyURL, latency: 2 * time.Millisecond, driver: c.driver, mode: c.mode})
	b.load.DoAsks = c.doAsks
	// Registered after the workers' pool, so run before its Close: ending
	// every proxied connection frees whatever hangs on one.
	t.Cleanup(func() { _ = proxy.Close() })
	return b, proxy
}

// underLoad runs the workload, a dispatcher and a reconciler through the
// proxy while inject injects its faults (from the time the workload has
// committed minCommitted calls), then lets everything finish with a healthy
// network and checks the history.
func underLoad(t *testing.T, b *bundle, inject func()) {
	t.Helper()
	underLoadOpts(t, b, faults.CheckOpts{}, inject)
}

// underLoadOpts is underLoad with the checker's options.
func underLoadOpts(t *testing.T, b *bundle, opts faults.CheckOpts, inject func()) {
	t.Helper()
	stopSubmit := b.submit(t, 2, 5*time.Millisecond)
	stopDispatch := b.runDispatcher(t)
	stopReconcile := b.runReconciler(t)
	b.awaitCommitted(t, minCommitted) // work under way before the first fault
	inject()
	stopSubmit()
	stopDispatch()
	stopReconcile()
	b.finish(t, opts)
}

// TestProxy puts a misbehaving network between the workers and PostgreSQL:
// stalls, cuts, resets, black holes, and connections ended right after a
// COMMIT, a claim or an outcome reached the server.
func TestProxy(t *testing.T) {
	t.Parallel()
	rounds := faults.Scale(4, 30)

	t.Run("Stall", func(t *testing.T) {
		t.Parallel()
		b, proxy := proxied(t)
		underLoad(t, b, func() {
			for range rounds / 2 {
				proxy.Stall()
				time.Sleep(1500 * time.Millisecond) // past the call timeout, within the lease
				proxy.Resume()
				tally.Fault("proxy_stall")
				time.Sleep(300 * time.Millisecond)
			}
		})
	})

	// Cuts through either driver, and under callers running their calls
	// inline with Do.
	for _, tt := range campaignClients() {
		t.Run("Cut"+tt.name, func(t *testing.T) {
			t.Parallel()
			b, proxy := proxiedClient(t, tt)
			n := rounds
			if tt.short {
				n = faults.Scale(rounds/2, rounds)
			}
			underLoad(t, b, func() {
				for range n {
					tally.Faults("proxy_cut"+tt.suffix, proxy.Cut())
					time.Sleep(300 * time.Millisecond)
				}
			})
		})
	}

	t.Run("Reset", func(t *testing.T) {
		t.Parallel()
		b, proxy := proxied(t)
		underLoad(t, b, func() {
			for range rounds {
				tally.Faults("proxy_reset", proxy.Reset())
				time.Sleep(300 * time.Millisecond)
			}
		})
	})

	t.Run("BlackHole", func(t *testing.T) {
		t.Parallel()
		b, proxy := proxied(t)
		// Cut off for longer than their lease, workers may rightly fail to
		// store an outcome they know.
		underLoadOpts(t, b, faults.CheckOpts{Crashed: true}, func() {
			// Past the lease: every connection open in the hole stays dead
			// (its peer never hears a word again, as after a silent NAT
			// timeout), and only new connections work afterwards.
			proxy.BlackHole()
			tally.Fault("proxy_blackhole")
			time.Sleep(3 * time.Second)
			proxy.Heal()
		})
	})

	t.Run("EndAfterCommit", func(t *testing.T) {
		t.Parallel()
		b, proxy := proxied(t)
		trigger := proxy.EndAfter("commit", faults.ActionCut, rounds*2)
		underLoad(t, b, func() {
			require.Eventually(t, func() bool { return trigger.Fired() >= rounds }, 30*time.Second, 10*time.Millisecond)
		})
		tally.Faults("proxy_end_after_commit", trigger.Fired())
	})

	t.Run("ResetAfterClaim", func(t *testing.T) {
		t.Parallel()
		b, proxy := proxied(t)
		trigger := proxy.EndAfter("-- name: OutboxClaimBatch", faults.ActionReset, rounds)
		underLoad(t, b, func() {
			require.Eventually(t, func() bool { return trigger.Fired() >= rounds }, 30*time.Second, 10*time.Millisecond)
		})
		tally.Faults("proxy_reset_after_claim", trigger.Fired())
	})

	t.Run("ResetAfterOutcome", func(t *testing.T) {
		t.Parallel()
		b, proxy := proxied(t)
		trigger := proxy.EndAfter("-- name: OutboxFinish", faults.ActionReset, rounds)
		underLoad(t, b, func() {
			require.Eventually(t, func() bool { return trigger.Fired() >= rounds }, 30*time.Second, 10*time.Millisecond)
		})
		tally.Faults("proxy_reset_after_outcome", trigger.Fired())
	})
}
