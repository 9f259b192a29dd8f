package failover_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/failover"
	"github.com/pgonce/pgonce/internal/faults"
)

// TestFailover runs the campaign through a failover of a synchronous pair
// (remote_apply): nothing acknowledged is lost, nothing runs twice, every
// wait ends with its key's outcome. The long profile (make failover) runs
// every mode: synchronous_commit = on, and the asynchronous ones, where the
// campaign measures what is lost and requires the at-most-once hazard to
// show, unless the tools claim with ToolOpts.ReplicatedClaim.
func TestFailover(t *testing.T) {
	t.Parallel()
	t.Run("SyncRemoteApply", func(t *testing.T) {
		t.Parallel()
		campaign(t, campaignOpts{mode: failover.SyncRemoteApply})
	})
	if !faults.Long() {
		return
	}
	t.Run("SyncOn", func(t *testing.T) {
		t.Parallel()
		campaign(t, campaignOpts{mode: failover.SyncOn})
	})
	// Asynchronous: the standby misses what the primary committed after
	// the cut. An at-most-once call of the backlog acted under a claim the
	// standby never saw, and runs again on the new primary.
	t.Run("Async", func(t *testing.T) {
		t.Parallel()
		f := campaign(t, campaignOpts{mode: failover.Async})
		require.Positive(t, f.Duplicates[faults.ToolOnce], "the at-most-once hazard shows: %s", f)
	})
	// The standby named synchronous, commits waiting for none by default:
	// the same hazard, until the tools claim with ReplicatedClaim.
	t.Run("AsyncNamed", func(t *testing.T) {
		t.Parallel()
		f := campaign(t, campaignOpts{mode: failover.AsyncNamed})
		require.Positive(t, f.Duplicates[faults.ToolOnce], "the at-most-once hazard shows: %s", f)
	})
	t.Run("AsyncNamedReplicatedClaim", func(t *testing.T) {
		t.Parallel()
		f := campaign(t, campaignOpts{mode: failover.AsyncNamed, replicatedClaims: true})
		require.Zero(t, f.Duplicates[faults.ToolOnce], "at-most-once calls acted twice: %s", f)
		require.Zero(t, f.Duplicates[faults.ToolNatural], "natural-id calls acted twice: %s", f)
	})
}
