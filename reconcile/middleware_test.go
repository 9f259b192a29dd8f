package reconcile_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/reconcile"
)

func TestRunOnceLookupsRunMiddleware(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testRunOnceLookupsRunMiddleware[pgx.Tx], testRunOnceLookupsRunMiddleware[*sql.Tx])
}

func testRunOnceLookupsRunMiddleware[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()
	bundle := setup(t, driver)
	var (
		mu   sync.Mutex
		seen []outbox.ProviderCall
		outs []outbox.ProviderOutcome
	)
	recorder := outbox.MiddlewareFunc(func(ctx context.Context, call *outbox.ProviderCall, next func(ctx context.Context) outbox.ProviderResult) outbox.ProviderResult {
		res := next(ctx)
		mu.Lock()
		defer mu.Unlock()
		seen, outs = append(seen, *call), append(outs, res.Outcome)
		return res
	})
	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("provision", bundle.payments, outbox.LookupByNaturalID))
	bundle.client = driver.Client(t, outbox.Config{Schema: bundle.schema, Registry: registry, Middleware: []outbox.Middleware{recorder}})

	found, missing := call("provision", 1), call("provision", 2)
	bundle.payments.effects[found.NaturalID] = 1
	crashed(t, bundle, time.Hour, found, missing)

	r, err := reconcile.New(bundle.client, reconcile.Config{})
	require.NoError(t, err)
	report, err := r.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, report.Resolved["provision"][reconcile.OutcomeFound])
	require.Equal(t, 1, report.Resolved["provision"][reconcile.OutcomeRequeued])

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, seen, 2)
	byNaturalID := map[string]outbox.ProviderOutcome{}
	for i, call := range seen {
		require.Equal(t, outbox.ProviderOpLookup, call.Op)
		require.Equal(t, outbox.LookupByNaturalID, call.Delivery)
		byNaturalID[call.Request.NaturalID] = outs[i]
	}
	require.Equal(t, map[string]outbox.ProviderOutcome{
		found.NaturalID:   outbox.ProviderFound,
		missing.NaturalID: outbox.ProviderNotFound,
	}, byNaturalID)
}
