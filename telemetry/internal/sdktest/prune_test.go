package sdktest_test

import (
	"database/sql"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/telemetry"
)

func TestTracedPrune(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testTracedPrune[pgx.Tx], testTracedPrune[*sql.Tx])
}

func testTracedPrune[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()
	bundle := setup(t)
	var now atomic.Int64
	now.Store(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC).UnixNano())
	registry := outbox.NewRegistry()
	require.NoError(t, registry.Register("refund", bundle.refunds, outbox.IdempotentByKey))
	client := telemetry.Traced(driver.Client(t, outbox.Config{
		Schema: bundle.schema, Registry: registry,
		NowFunc: func() time.Time { return time.Unix(0, now.Load()).UTC() },
	}), bundle.tel)

	call := outbox.Call{RunID: "run-1", Step: 1, Tool: "refund", Args: map[string]any{"order": 8842}}
	_, err := client.Do(t.Context(), call, nil)
	require.NoError(t, err)
	now.Add(int64(outbox.RetentionDefault + time.Second))

	dry, err := client.Prune(t.Context(), &outbox.PruneOpts{DryRun: true})
	require.NoError(t, err)
	require.Equal(t, int64(1), dry.Keys)
	res, err := client.Prune(t.Context(), nil)
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Keys)

	prunes := endedNamed(bundle.spans, "prune")
	require.Len(t, prunes, 2)
	for _, span := range prunes {
		require.Equal(t, int64(1), attrs(span.Attributes())[telemetry.AttrPrunedKeys].AsInt64())
	}

	// The late duplicate is an expired submit.
	_, err = client.Submit(t.Context(), call)
	require.ErrorIs(t, err, outbox.ErrExpired)
	require.Equal(t, int64(1), submitCounts(t, bundle)[[2]string{"submit", "expired"}])

	var rm metricdata.ResourceMetrics
	require.NoError(t, bundle.reader.Collect(t.Context(), &rm))
	pruned := map[string]int64{}
	for _, scope := range rm.ScopeMetrics {
		for _, m := range scope.Metrics {
			if m.Name != telemetry.MetricPruned {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				op, _ := dp.Attributes.Value(telemetry.AttrOp)
				pruned[op.AsString()] += dp.Value
			}
		}
	}
	require.Equal(t, map[string]int64{"tombstone": 1, "delete": 0}, pruned)
}
