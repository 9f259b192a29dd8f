package sdktest_test

import (
	"context"
	"database/sql"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/httpprovider"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/telemetry"
)

func TestTracedClient(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testTracedClient[pgx.Tx], testTracedClient[*sql.Tx])
}

func onlySpan(t *testing.T, bundle *testBundle, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool {
		found = endedNamed(bundle.spans, name)
		return len(found) > 0
	}, time.Minute, 5*time.Millisecond)
	require.Len(t, found, 1, name)
	return found[0]
}

func testTracedClient[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()

	t.Run("SubmitSpanIsTheParentOfTheDispatchedCall", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", bundle.refunds, outbox.IdempotentByKey))
		submitter := telemetry.Traced(driver.Client(t, outbox.Config{Schema: bundle.schema, Registry: registry}), bundle.tel)

		ctx, request := bundle.tracer.Tracer("test").Start(t.Context(), "POST /refunds")
		call := outbox.Call{RunID: "run-1", Step: 1, Tool: "refund", Args: map[string]any{"order": 8842}}
		var res outbox.Result
		require.NoError(t, driver.InTx(t, ctx, func(tx TTx) error {
			var err error
			res, err = submitter.SubmitTx(ctx, tx, call)
			return err
		}))
		request.End()

		send := onlySpan(t, bundle, "send refund")
		require.Equal(t, trace.SpanKindProducer, send.SpanKind())
		require.Equal(t, request.SpanContext().SpanID(), send.Parent().SpanID())
		got := attrs(send.Attributes())
		require.Equal(t, "created", got[telemetry.AttrOutcome].AsString())
		require.Equal(t, string(res.Key), got[telemetry.AttrKey].AsString())
		require.False(t, got[telemetry.AttrReplayed].AsBool())

		runner := driver.Client(t, outbox.Config{Schema: bundle.schema, Registry: registry, Middleware: []outbox.Middleware{bundle.tel}})
		d, err := dispatcher.New(runner, dispatcher.Config{PollInterval: 20 * time.Millisecond})
		require.NoError(t, err)
		runCtx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(runCtx) }()
		t.Cleanup(func() {
			stop()
			require.NoError(t, <-done)
		})

		process := onlySpan(t, bundle, "process refund")
		require.Equal(t, send.SpanContext().TraceID(), process.SpanContext().TraceID())
		require.Equal(t, send.SpanContext().SpanID(), process.Parent().SpanID())
		require.Equal(t, send.SpanContext().SpanID(), process.Links()[0].SpanContext.SpanID())

		// The duplicate records that it was a replay; a conflict is an error.
		waitCtx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		_, err = submitter.Wait(waitCtx, res.Key)
		require.NoError(t, err)
		wait := onlySpan(t, bundle, "wait")
		require.Equal(t, "succeeded", attrs(wait.Attributes())[telemetry.AttrOutcome].AsString())

		dup, err := submitter.Submit(t.Context(), call)
		require.NoError(t, err)
		require.True(t, dup.Replayed())
		_, err = submitter.Submit(t.Context(), outbox.Call{RunID: "run-1", Step: 1, Tool: "refund", Args: map[string]any{"order": 1}})
		require.ErrorIs(t, err, outbox.ErrKeyConflict)

		byOutcome := map[string]sdktrace.ReadOnlySpan{}
		for _, span := range endedNamed(bundle.spans, "send refund") {
			byOutcome[attrs(span.Attributes())[telemetry.AttrOutcome].AsString()] = span
		}
		require.Len(t, byOutcome, 3)
		require.True(t, attrs(byOutcome["replayed"].Attributes())[telemetry.AttrReplayed].AsBool())
		require.Equal(t, codes.Unset, byOutcome["replayed"].Status().Code)
		require.Equal(t, codes.Error, byOutcome["conflict"].Status().Code)

		require.Equal(t, map[[2]string]int64{
			{"submit", "created"}:  1,
			{"submit", "replayed"}: 1,
			{"submit", "conflict"}: 1,
		}, submitCounts(t, bundle))
	})

	t.Run("DoSpanIsTheParentOfItsProviderCall", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t)
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", bundle.refunds, outbox.IdempotentByKey))
		client := telemetry.Traced(driver.Client(t, outbox.Config{Schema: bundle.schema, Registry: registry, Middleware: []outbox.Middleware{bundle.tel}}), bundle.tel)

		call := outbox.Call{RunID: "run-1", Step: 1, Tool: "refund", Args: map[string]any{"order": 8842}}
		_, err := client.Do(t.Context(), call, nil)
		require.NoError(t, err)
		again, err := client.Do(t.Context(), call, nil)
		require.NoError(t, err)
		require.True(t, again.Replayed())

		process := onlySpan(t, bundle, "process refund")
		dos := endedNamed(bundle.spans, "do refund")
		require.Len(t, dos, 2)
		var first sdktrace.ReadOnlySpan
		for _, span := range dos {
			if attrs(span.Attributes())[telemetry.AttrOutcome].AsString() == "succeeded" {
				first = span
			}
		}
		require.NotNil(t, first)
		require.Equal(t, first.SpanContext().SpanID(), process.Parent().SpanID())
		require.False(t, process.Parent().IsRemote())
		require.Equal(t, map[[2]string]int64{
			{"do", "succeeded"}: 1,
			{"do", "replayed"}:  1,
		}, submitCounts(t, bundle))
	})
}

// submitCounts returns the submit counter's values by op and outcome.
func submitCounts(t *testing.T, bundle *testBundle) map[[2]string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, bundle.reader.Collect(t.Context(), &rm))
	counts := map[[2]string]int64{}
	for _, scope := range rm.ScopeMetrics {
		for _, m := range scope.Metrics {
			if m.Name != telemetry.MetricSubmits {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				op, _ := dp.Attributes.Value(telemetry.AttrOp)
				outcome, _ := dp.Attributes.Value(telemetry.AttrOutcome)
				counts[[2]string{op.AsString(), outcome.AsString()}] += dp.Value
			}
		}
	}
	return counts
}

// TestDownstreamKeyOnTheProviderCallsSpan runs calls through httpprovider
// against a keyed test API: the provider call's span names the key sent
// downstream when httpprovider transformed it, and leaves the attribute off
// when the call's own key went.
func TestDownstreamKeyOnTheProviderCallsSpan(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testDownstreamKeyOnTheProviderCallsSpan[pgx.Tx], testDownstreamKeyOnTheProviderCallsSpan[*sql.Tx])
}

func testDownstreamKeyOnTheProviderCallsSpan[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()
	for _, tt := range []struct {
		name    string
		keyFunc func(outbox.Key) (string, error)
	}{
		{name: "Truncated", keyFunc: httpprovider.Truncate(40)},
		{name: "AsItIs"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			bundle := setup(t)
			received := make(chan string, 1)
			api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				received <- r.Header.Get(httpprovider.KeyHeaderDefault)
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(`{"id":"re_1"}`))
			}))
			t.Cleanup(api.Close)
			provider, err := httpprovider.New(httpprovider.Config{URL: api.URL, KeyFunc: tt.keyFunc})
			require.NoError(t, err)
			registry := outbox.NewRegistry()
			require.NoError(t, registry.Register("refund", provider, outbox.IdempotentByKey))
			client := driver.Client(t, outbox.Config{Schema: bundle.schema, Registry: registry, Middleware: []outbox.Middleware{bundle.tel}})

			res, err := client.Do(t.Context(), outbox.Call{RunID: "run-1", Step: 1, Tool: "refund", Args: map[string]any{"order": 8842}}, nil)
			require.NoError(t, err)
			require.Equal(t, outbox.StateSucceeded, res.State)
			sent := <-received

			got := attrs(onlySpan(t, bundle, "process refund").Attributes())
			require.Equal(t, string(res.Key), got[telemetry.AttrKey].AsString())
			downstream, ok := got[telemetry.AttrDownstreamKey]
			if tt.keyFunc == nil {
				require.Equal(t, string(res.Key), sent)
				require.False(t, ok, "the call's own key went downstream: no %s", telemetry.AttrDownstreamKey)
				return
			}
			require.NotEqual(t, string(res.Key), sent)
			require.True(t, ok, "no %s", telemetry.AttrDownstreamKey)
			require.Equal(t, sent, downstream.AsString())
		})
	}
}
