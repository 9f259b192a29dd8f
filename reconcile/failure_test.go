package reconcile_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/reconcile"
)

// declined is a provider's own failure body, with the spacing and member
// order a replay must keep.
const declined = "{ \"code\" : \"card_declined\",\n  \"decline_code\":\"insufficient_funds\" }"

// requireVerbatim asserts that got holds exactly the bytes of want: a
// replay keeps the provider's spacing and member order, which JSON
// equality would not check.
func requireVerbatim(t *testing.T, want string, got []byte, msgAndArgs ...any) {
	t.Helper()
	require.Equal(t, []byte(want), got, msgAndArgs...)
}

// declinedLookup finds every action failed for good, with its own body.
type declinedLookup struct{ *payments }

func (declinedLookup) Lookup(context.Context, outbox.Request) (json.RawMessage, bool, error) {
	return nil, false, outbox.PermanentBody(json.RawMessage(declined), errors.New("charge found declined"))
}

func TestRunOnceFailureBodiesAndLogs(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testRunOnceFailureBodiesAndLogs[pgx.Tx], testRunOnceFailureBodiesAndLogs[*sql.Tx])
}

func testRunOnceFailureBodiesAndLogs[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()
	bundle := setup(t, driver)
	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("refund", bundle.payments, outbox.IdempotentByKey))
	require.NoError(t, registry.Register("provision", declinedLookup{bundle.payments}, outbox.LookupByNaturalID))
	require.NoError(t, registry.Register("email", bundle.payments, outbox.AtMostOnce))
	clientLogger, clientLogs := pgoncetest.CaptureLogs()
	bundle.client = driver.Client(t, outbox.Config{Schema: bundle.schema, Registry: registry, Logger: clientLogger})
	keys := crashed(t, bundle, time.Hour, call("refund", 1), call("provision", 2), call("email", 3))
	requeued, failed, review := keys[0], keys[1], keys[2]

	logger, logs := pgoncetest.CaptureLogs()
	r, err := reconcile.New(bundle.client, reconcile.Config{Logger: logger})
	require.NoError(t, err)
	report, err := r.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, report.Resolved["provision"][reconcile.OutcomeFailed])
	require.Equal(t, 1, report.Resolved["email"][reconcile.OutcomeNeedsReview])
	require.Equal(t, 1, report.Resolved["refund"][reconcile.OutcomeRequeued])

	// The failure the lookup found is stored and replayed byte for byte.
	res, err := bundle.client.Get(t.Context(), failed)
	require.NoError(t, err)
	require.Equal(t, outbox.StateFailed, res.State)
	requireVerbatim(t, declined, res.Failure)
	require.Equal(t, "lookup: permanent: charge found declined", res.LastError)
	replay, err := bundle.client.Submit(t.Context(), call("provision", 2))
	require.NoError(t, err)
	require.True(t, replay.Replayed())
	requireVerbatim(t, declined, replay.Failure)
	require.Equal(t, `{"status":"failed","key":"`+string(failed)+`","replayed":true,"failure":`+declined+`}`,
		string(replay.Observation().JSON()))
	require.Zero(t, bundle.payments.calls, "the reconciler never calls a provider")

	// What an operator must act on is a warning, on the reconciler's logger;
	// a requeue is a debug line.
	warning := func(key outbox.Key) func(pgoncetest.LogRecord) bool {
		return func(r pgoncetest.LogRecord) bool { return r.Level == slog.LevelWarn && r.Attrs["key"] == string(key) }
	}
	for _, tt := range []struct {
		key                      outbox.Key
		tool, message, lastError string
	}{
		{failed, "provision", "pgonce: key failed permanently", "lookup: permanent: charge found declined"},
		{review, "email", "pgonce: key needs review; nothing runs until an operator resolves it", "lease expired: the attempt's outcome is unknown"},
	} {
		got := logs.Matching(warning(tt.key))
		require.Len(t, got, 1, tt.message)
		require.Equal(t, tt.message, got[0].Message)
		require.Equal(t, tt.tool, got[0].Attrs["tool"])
		require.Equal(t, "2", got[0].Attrs["attempt"], "the reconciler resolves under a new attempt")
		require.Equal(t, tt.lastError, got[0].Attrs["error"])
	}
	require.Empty(t, logs.Matching(warning(requeued)))
	debug := logs.Matching(func(r pgoncetest.LogRecord) bool { return r.Attrs["key"] == string(requeued) })
	require.Len(t, debug, 1)
	require.Equal(t, slog.LevelDebug, debug[0].Level)
	require.Equal(t, "refund", debug[0].Attrs["tool"])
	for _, key := range keys {
		require.Empty(t, clientLogs.Matching(warning(key)), "the reconciler's logs go to its own logger")
	}
}
