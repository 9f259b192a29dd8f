package faults_test

import (
	"context"
	"testing"
	"time"

	"github.com/pgonce/pgonce/internal/faults"
)

// TestWaitThroughProxy waits with Client.Wait through a misbehaving network
// on keys that a dispatcher completes over another, healthy, connection
// path: the calls are submitted and run directly, and only the waits go
// through the proxy. Every wait must return its key's terminal result, never
// an error while its context is live.
func TestWaitThroughProxy(t *testing.T) {
	t.Parallel()
	rounds := faults.Scale(4, 30)

	for _, tt := range []struct {
		name   string
		inject func(proxy *faults.Proxy)
	}{
		{name: "Cut", inject: func(proxy *faults.Proxy) {
			for range rounds {
				tally.Faults("wait_proxy_cut", proxy.Cut())
				time.Sleep(300 * time.Millisecond)
			}
		}},
		{name: "Reset", inject: func(proxy *faults.Proxy) {
			for range rounds / 2 {
				tally.Faults("wait_proxy_reset", proxy.Reset())
				time.Sleep(300 * time.Millisecond)
			}
		}},
		{name: "BlackHole", inject: func(proxy *faults.Proxy) {
			// Past the lease; then the network resets the connections that
			// fell into the hole, as a NAT or firewall that forgot them
			// answers the next packet with RST.
			proxy.BlackHole()
			tally.Fault("wait_proxy_blackhole")
			time.Sleep(3 * time.Second)
			proxy.Heal()
			tally.Faults("wait_proxy_reset", proxy.Reset())
		}},
		{name: "BlackHoleForever", inject: func(proxy *faults.Proxy) {
			// As in TestProxy: the connections open in the hole stay dead,
			// and nobody tells their peer; only new ones work after it. A
			// wait's read stuck on one ends at its StatementTimeout.
			proxy.BlackHole()
			tally.Fault("wait_proxy_blackhole")
			time.Sleep(3 * time.Second)
			proxy.Heal()
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b, proxy := proxied(t)
			// Submits and the dispatcher use the direct pool; b.client, the
			// waits' client, reaches the database through the proxy.
			direct := &faults.Workload{
				Client: faults.PgxSubmitter(b.checker, b.direct), History: b.history,
				RunID: b.load.RunID, RollbackEvery: 7,
			}
			dispatch, _ := runners(t, b.checker, b.grace)
			waits := &waiters{timeout: faults.Scale(45*time.Second, 2*time.Minute)}
			stopSubmit := background(t, "the workload", func(ctx context.Context) {
				for ctx.Err() == nil {
					// Two waits per key, so that one key's waits share the
					// client's listener and its reads.
					if key, fate := direct.SubmitOne(ctx); fate == faults.FateCommitted {
						waits.wait(b.client, key)
						waits.wait(b.client, key)
					}
					select {
					case <-ctx.Done():
					case <-time.After(10 * time.Millisecond):
					}
				}
			})
			time.Sleep(200 * time.Millisecond) // waits under way before the first fault
			injected := make(chan struct{})
			go func() {
				defer close(injected)
				tt.inject(proxy)
			}()
			// The dispatcher starts a second into the faults, so that the
			// first keys are waited on through all of them.
			time.Sleep(time.Second)
			stopDispatch := background(t, "Dispatcher.Run", func(ctx context.Context) { _ = dispatch(ctx) })
			<-injected
			stopSubmit()
			waits.require(t, "Client.Wait must return the terminal result through a faulty network")
			stopDispatch()
			b.check(t, faults.CheckOpts{})
		})
	}
}
