package reconcile_test

import (
	"database/sql"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/reconcile"
)

func TestRunOnceTransactional(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testRunOnceTransactional[pgx.Tx], testRunOnceTransactional[*sql.Tx])
}

func testRunOnceTransactional[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()

	t.Run("StrandedClaimIsDueAgainNeverReviewed", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		table := pgoncetest.EffectTable(t, bundle.schema)
		registry := outbox.NewRegistry()
		require.NoError(t, outbox.RegisterTx(registry, "credit", drivertest.EffectProvider[TTx](table, nil), nil))
		require.NoError(t, registry.Register("email", bundle.payments, outbox.AtMostOnce))
		client := bundle.serving(t, registry)

		// Two claims stranded by a dead worker, at an attempt whose
		// predecessors left the outcome unknown: the transactional one
		// rolled back with its outcome, the at-most-once one is unknown.
		keys := crashed(t, bundle, time.Hour, call("credit", 1), call("email", 2))
		credit, email := keys[0], keys[1]
		_, err := pgoncetest.Pool(t).Exec(t.Context(), "UPDATE "+ident.Quote(bundle.schema)+".pgonce_key SET attempt = 5, ambiguous = true")
		require.NoError(t, err)

		r, err := reconcile.New(client, reconcile.Config{})
		require.NoError(t, err)
		report, err := r.RunOnce(t.Context())
		require.NoError(t, err)
		require.Equal(t, 1, report.Resolved["credit"][reconcile.OutcomeRequeued])
		require.Zero(t, report.Resolved["credit"][reconcile.OutcomeNeedsReview])
		require.Equal(t, 1, report.Resolved["email"][reconcile.OutcomeNeedsReview])
		require.Equal(t, outbox.StatePending, state(t, bundle, credit))
		require.Equal(t, outbox.StateNeedsReview, state(t, bundle, email))

		res, err := client.Do(t.Context(), call("credit", 1), nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, res.State)
		require.Equal(t, 1, pgoncetest.CountEffects(t, table, credit))
	})
}
