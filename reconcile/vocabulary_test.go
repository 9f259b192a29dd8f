package reconcile_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/reconciler"
	"github.com/pgonce/pgonce/reconcile"
)

// TestOutcomeValues keeps the outcomes' values, which Outcome's doc lists and
// a Report's JSON carries, as they are documented.
func TestOutcomeValues(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		outcome reconcile.Outcome
		value   string
	}{
		{reconcile.OutcomeRequeued, "requeued"},
		{reconcile.OutcomeFound, "found"},
		{reconcile.OutcomeNeedsReview, "needs_review"},
		{reconcile.OutcomeLookupFailed, "lookup_failed"},
		{reconcile.OutcomeSuperseded, "superseded"},
		{reconcile.OutcomeFailed, "failed"},
	} {
		require.Equal(t, tt.value, string(tt.outcome))
	}
}

// TestDefaultsAreTheEngines checks that the defaults Config documents are the
// ones the engine applies, which a dispatcher's maintenance reconciler has
// too.
func TestDefaultsAreTheEngines(t *testing.T) {
	t.Parallel()

	require.Equal(t, reconciler.GraceDefault, reconcile.GraceDefault)
	require.Equal(t, reconciler.BatchSizeDefault, reconcile.BatchSizeDefault)
	require.Equal(t, reconciler.StalePendingDefault, reconcile.StalePendingDefault)
}
