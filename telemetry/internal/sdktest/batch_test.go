package sdktest_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/reconcile"
	"github.com/pgonce/pgonce/telemetry"
)

func TestBatchAndRunSpans(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testBatchAndRunSpans[pgx.Tx], testBatchAndRunSpans[*sql.Tx])
}

// metricsNamed returns the data of the metric named name, nil when none
// was recorded.
func metricsNamed(t *testing.T, bundle *testBundle, name string) metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, bundle.reader.Collect(t.Context(), &rm))
	for _, scope := range rm.ScopeMetrics {
		for _, m := range scope.Metrics {
			if m.Name == name {
				return m.Data
			}
		}
	}
	return nil
}

// histogramTotals returns a histogram's count and sum over its series.
func histogramTotals[N int64 | float64](t *testing.T, data metricdata.Aggregation) (count uint64, sum N) {
	t.Helper()
	hist, ok := data.(metricdata.Histogram[N])
	require.True(t, ok, "%T", data)
	for _, dp := range hist.DataPoints {
		count += dp.Count
		sum += dp.Sum
	}
	return count, sum
}

func linkedTo(span sdktrace.ReadOnlySpan, sc trace.SpanContext) bool {
	for _, link := range span.Links() {
		if link.SpanContext.SpanID() == sc.SpanID() && link.SpanContext.TraceID() == sc.TraceID() {
			return true
		}
	}
	return false
}

func testBatchAndRunSpans[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()

	t.Run("ClaimAndRecordBatchesLinkToTheSubmitter", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", bundle.refunds, outbox.IdempotentByKey))
		client := driver.Client(t, outbox.Config{Schema: bundle.schema, Registry: registry, Middleware: []outbox.Middleware{bundle.tel}})
		submitter := telemetry.Traced(client, bundle.tel)
		res, err := submitter.Submit(t.Context(), outbox.Call{RunID: "run-1", Step: 1, Tool: "refund", Args: map[string]any{"order": 8842}})
		require.NoError(t, err)
		send := onlySpan(t, bundle, "send refund")

		d, err := dispatcher.New(client, dispatcher.Config{Concurrency: 8, BatchSize: 8, PollInterval: 10 * time.Millisecond, MaintenanceDisabled: true})
		require.NoError(t, err)
		runCtx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(runCtx) }()
		t.Cleanup(func() {
			stop()
			require.NoError(t, <-done)
		})
		record := onlySpan(t, bundle, "record")
		// Idle polls after the claim that took the key leave no span.
		require.Eventually(t, func() bool {
			data := metricsNamed(t, bundle, telemetry.MetricClaimSize)
			if data == nil {
				return false
			}
			count, _ := histogramTotals[int64](t, data)
			return count >= 3
		}, time.Minute, 5*time.Millisecond)
		claim := onlySpan(t, bundle, "claim")

		for _, span := range []sdktrace.ReadOnlySpan{claim, record} {
			require.Equal(t, trace.SpanKindClient, span.SpanKind(), span.Name())
			require.True(t, linkedTo(span, send.SpanContext()), span.Name())
			require.Equal(t, string(res.Key), attrs(span.Links()[0].Attributes)[telemetry.AttrKey].AsString())
			got := attrs(span.Attributes())
			require.Equal(t, "pgonce", got["messaging.system"].AsString())
			require.Equal(t, span.Name(), got["messaging.operation.name"].AsString())
			require.Equal(t, int64(1), got["messaging.batch.message_count"].AsInt64())
			require.Equal(t, codes.Unset, span.Status().Code)
		}
		require.Equal(t, "receive", attrs(claim.Attributes())["messaging.operation.type"].AsString())
		require.Equal(t, int64(8), attrs(claim.Attributes())[telemetry.AttrBatchLimit].AsInt64())
		require.Equal(t, "settle", attrs(record.Attributes())["messaging.operation.type"].AsString())
		require.Equal(t, int64(1), attrs(record.Attributes())[telemetry.AttrWritten].AsInt64())
		process := onlySpan(t, bundle, "process refund")
		require.False(t, claim.EndTime().After(process.StartTime()), "the claim ends before the call starts")
		require.False(t, process.EndTime().After(record.StartTime()), "the call ends before its record starts")

		// One key claimed, one recorded; the claims' durations are measured.
		_, claimed := histogramTotals[int64](t, metricsNamed(t, bundle, telemetry.MetricClaimSize))
		require.Equal(t, int64(1), claimed)
		count, recorded := histogramTotals[int64](t, metricsNamed(t, bundle, telemetry.MetricRecordSize))
		require.Equal(t, uint64(1), count)
		require.Equal(t, int64(1), recorded)
		claims, _ := histogramTotals[int64](t, metricsNamed(t, bundle, telemetry.MetricClaimSize))
		claimDurations, _ := histogramTotals[float64](t, metricsNamed(t, bundle, telemetry.MetricClaimDuration))
		require.GreaterOrEqual(t, claimDurations, claims)
		recordDurations, _ := histogramTotals[float64](t, metricsNamed(t, bundle, telemetry.MetricRecordDuration))
		require.Equal(t, uint64(1), recordDurations)
	})

	t.Run("CommitToCallIsHowLongTheKeyWasDue", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", bundle.refunds, outbox.IdempotentByKey))
		// The key is submitted by a client whose clock is an hour behind, so
		// that it has been due for an hour when a dispatcher, on the
		// database's clock, claims it.
		const behind = time.Hour
		submitter := driver.Client(t, outbox.Config{
			Schema: bundle.schema, Registry: registry,
			NowFunc: func() time.Time { return time.Now().Add(-behind) },
		})
		_, err := submitter.Submit(t.Context(), outbox.Call{RunID: "run-1", Step: 1, Tool: "refund", Args: map[string]any{"order": 8842}})
		require.NoError(t, err)

		client := driver.Client(t, outbox.Config{Schema: bundle.schema, Registry: registry, Middleware: []outbox.Middleware{bundle.tel}})
		d, err := dispatcher.New(client, dispatcher.Config{PollInterval: 10 * time.Millisecond, MaintenanceDisabled: true})
		require.NoError(t, err)
		runCtx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(runCtx) }()
		t.Cleanup(func() {
			stop()
			require.NoError(t, <-done)
		})
		onlySpan(t, bundle, "record")

		data := metricsNamed(t, bundle, telemetry.MetricCommitToCall)
		require.NotNil(t, data, "no %s", telemetry.MetricCommitToCall)
		hist, ok := data.(metricdata.Histogram[float64])
		require.True(t, ok, "%T", data)
		require.Len(t, hist.DataPoints, 1)
		point := hist.DataPoints[0]
		require.Equal(t, uint64(1), point.Count)
		tool, ok := point.Attributes.Value(telemetry.AttrTool)
		require.True(t, ok)
		require.Equal(t, "refund", tool.AsString())
		require.InDelta(t, behind.Seconds(), point.Sum, time.Minute.Seconds(), "the key was due for about an hour")
	})

	t.Run("ABigBatchLinksToItsFirst32Submitters", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", bundle.refunds, outbox.IdempotentByKey))
		client := driver.Client(t, outbox.Config{Schema: bundle.schema, Registry: registry, Middleware: []outbox.Middleware{bundle.tel}})
		submitter := telemetry.Traced(client, bundle.tel)
		for step := range 40 {
			_, err := submitter.Submit(t.Context(), outbox.Call{RunID: "run-1", Step: int64(step), Tool: "refund", Args: step})
			require.NoError(t, err)
		}
		d, err := dispatcher.New(client, dispatcher.Config{Concurrency: 64, BatchSize: 64, PollInterval: 10 * time.Millisecond, MaintenanceDisabled: true})
		require.NoError(t, err)
		runCtx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(runCtx) }()
		t.Cleanup(func() {
			stop()
			require.NoError(t, <-done)
		})
		claim := onlySpan(t, bundle, "claim")
		require.Equal(t, int64(40), attrs(claim.Attributes())["messaging.batch.message_count"].AsInt64())
		require.Len(t, claim.Links(), 32)
	})

	t.Run("ReconcileRunIsTheParentOfItsLookupsAndPrune", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", bundle.refunds, outbox.IdempotentByKey))
		require.NoError(t, registry.Register("email", bundle.refunds, outbox.AtMostOnce))
		require.NoError(t, registry.Register("provision", &lookupProvider{found: true}, outbox.LookupByNaturalID))
		client := driver.Client(t, outbox.Config{Schema: bundle.schema, Registry: registry, Middleware: []outbox.Middleware{bundle.tel}})
		var keys []outbox.Key
		for i, call := range []outbox.Call{
			{RunID: "r", Step: 1, Tool: "refund", Args: 1},
			{RunID: "r", Step: 2, Tool: "email", Args: 2},
			{RunID: "r", Step: 3, Tool: "provision", NaturalID: "vm-1", Args: 3},
		} {
			res, err := client.Submit(t.Context(), call)
			require.NoError(t, err, i)
			keys = append(keys, res.Key)
		}
		pgoncetest.AbandonKeys(t, bundle.schema, time.Hour, keys...)

		reconciler, err := reconcile.New(client, reconcile.Config{})
		require.NoError(t, err)
		ctx, cron := bundle.tracer.Tracer("test").Start(t.Context(), "cron")
		report, err := reconciler.RunOnce(ctx)
		cron.End()
		require.NoError(t, err)
		require.Equal(t, 1, report.Resolved["provision"][reconcile.OutcomeFound])

		run := onlySpan(t, bundle, "reconcile")
		require.Equal(t, cron.SpanContext().SpanID(), run.Parent().SpanID())
		require.Equal(t, int64(3), attrs(run.Attributes())[telemetry.AttrExamined].AsInt64())
		require.Equal(t, int64(3), attrs(run.Attributes())[telemetry.AttrResolved].AsInt64())
		lookup := onlySpan(t, bundle, "lookup provision")
		require.Equal(t, run.SpanContext().SpanID(), lookup.Parent().SpanID())
		prune := onlySpan(t, bundle, "prune")
		require.Equal(t, run.SpanContext().SpanID(), prune.Parent().SpanID())

		resolutions := map[[2]string]int64{}
		data, ok := metricsNamed(t, bundle, telemetry.MetricResolutions).(metricdata.Sum[int64])
		require.True(t, ok)
		for _, dp := range data.DataPoints {
			resolutions[[2]string{value(dp.Attributes, telemetry.AttrTool), value(dp.Attributes, telemetry.AttrOutcome)}] += dp.Value
		}
		require.Equal(t, map[[2]string]int64{
			{"refund", "requeued"}:    1,
			{"email", "needs_review"}: 1,
			{"provision", "found"}:    1,
		}, resolutions)

		// The operator resolves the email sent to review: a span of its own,
		// a child of the operator's.
		opCtx, operator := bundle.tracer.Tracer("test").Start(t.Context(), "operator")
		resolved, err := client.Resolve(opCtx, keys[1], outbox.Resolution{
			Action: outbox.ResolveSucceeded, Response: json.RawMessage(`{"sent":true}`), By: "ops", Reason: "checked the mailbox",
		})
		operator.End()
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, resolved.State)
		resolve := onlySpan(t, bundle, "resolve")
		require.Equal(t, operator.SpanContext().SpanID(), resolve.Parent().SpanID())
		got := attrs(resolve.Attributes())
		require.Equal(t, string(keys[1]), got[telemetry.AttrKey].AsString())
		require.Equal(t, "succeeded", got[telemetry.AttrAction].AsString())
		require.Equal(t, "succeeded", got[telemetry.AttrState].AsString())
		require.Equal(t, codes.Unset, resolve.Status().Code)
	})

	t.Run("CancelAndRetryAreSpans", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", bundle.refunds, outbox.IdempotentByKey))
		client := driver.Client(t, outbox.Config{Schema: bundle.schema, Registry: registry, Middleware: []outbox.Middleware{bundle.tel}})
		res, err := client.Submit(t.Context(), outbox.Call{RunID: "r", Step: 1, Tool: "refund", Args: 1})
		require.NoError(t, err)

		// Retrying a pending key is refused: an error span.
		_, err = client.Retry(t.Context(), res.Key, outbox.RetryParams{By: "ops", Reason: "too early"})
		require.ErrorIs(t, err, outbox.ErrNotRetryable)
		_, err = client.Cancel(t.Context(), res.Key, outbox.CancelParams{By: "ops", Reason: "customer withdrew"})
		require.NoError(t, err)
		_, err = client.Retry(t.Context(), res.Key, outbox.RetryParams{By: "ops", Reason: "customer asked again"})
		require.NoError(t, err)

		cancel := onlySpan(t, bundle, "cancel")
		require.Equal(t, "cancelled", attrs(cancel.Attributes())[telemetry.AttrState].AsString())
		require.Equal(t, string(res.Key), attrs(cancel.Attributes())[telemetry.AttrKey].AsString())
		retries := endedNamed(bundle.spans, "retry")
		require.Len(t, retries, 2)
		statuses := map[codes.Code]int{}
		for _, span := range retries {
			require.Equal(t, "pending", attrs(span.Attributes())[telemetry.AttrState].AsString())
			statuses[span.Status().Code]++
		}
		require.Equal(t, map[codes.Code]int{codes.Error: 1, codes.Unset: 1}, statuses)
	})

	t.Run("ATracedPruneIsOneSpan", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", bundle.refunds, outbox.IdempotentByKey))
		client := telemetry.Traced(driver.Client(t, outbox.Config{Schema: bundle.schema, Registry: registry, Middleware: []outbox.Middleware{bundle.tel}}), bundle.tel)
		_, err := client.Prune(t.Context(), nil)
		require.NoError(t, err)
		_, err = client.Client.Prune(t.Context(), nil)
		require.NoError(t, err)
		require.Len(t, endedNamed(bundle.spans, "prune"), 2)
	})
}

func value(set attribute.Set, key attribute.Key) string {
	v, _ := set.Value(key)
	return v.AsString()
}
