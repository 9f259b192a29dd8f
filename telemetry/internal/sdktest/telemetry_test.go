package sdktest_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/telemetry"
)

type testBundle struct {
	spans   *tracetest.SpanRecorder
	tracer  *sdktrace.TracerProvider
	reader  *sdkmetric.ManualReader
	tel     *telemetry.Telemetry
	schema  string
	refunds outbox.ProviderFunc
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	spans := tracetest.NewSpanRecorder()
	tracer := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	meter := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() {
		_ = tracer.Shutdown(context.WithoutCancel(t.Context()))
		_ = meter.Shutdown(context.WithoutCancel(t.Context()))
	})
	tel, err := telemetry.New(telemetry.Config{TracerProvider: tracer, MeterProvider: meter})
	require.NoError(t, err)
	return &testBundle{
		spans: spans, tracer: tracer, reader: reader, tel: tel, schema: pgoncetest.Schema(t),
		refunds: func(context.Context, outbox.Request) (json.RawMessage, error) {
			return json.RawMessage(`{"refund":"re_1"}`), nil
		},
	}
}

// attrs returns a span's attributes by key.
func attrs(kvs []attribute.KeyValue) map[attribute.Key]attribute.Value {
	m := make(map[attribute.Key]attribute.Value, len(kvs))
	for _, kv := range kvs {
		m[kv.Key] = kv.Value
	}
	return m
}

func endedNamed(spans *tracetest.SpanRecorder, name string) []sdktrace.ReadOnlySpan {
	var found []sdktrace.ReadOnlySpan
	for _, span := range spans.Ended() {
		if span.Name() == name {
			found = append(found, span)
		}
	}
	return found
}

func TestTraceFromSubmitterToDispatcher(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testTraceFromSubmitterToDispatcher[pgx.Tx], testTraceFromSubmitterToDispatcher[*sql.Tx])
}

func testTraceFromSubmitterToDispatcher[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()
	bundle := setup(t)

	// The submitter: its own client, no middleware, a span of its own.
	submitRegistry := outbox.NewRegistry()
	require.NoError(t, submitRegistry.Register("refund", bundle.refunds, outbox.IdempotentByKey))
	submitter := driver.Client(t, outbox.Config{Schema: bundle.schema, Registry: submitRegistry})
	ctx, submitSpan := bundle.tracer.Tracer("test").Start(t.Context(), "POST /refunds")
	call := outbox.Call{RunID: "run-1", Step: 1, Tool: "refund", Args: map[string]any{"order": 8842}}
	var res outbox.Result
	require.NoError(t, driver.InTx(t, ctx, func(tx TTx) error {
		var err error
		res, err = submitter.SubmitTx(ctx, tx, bundle.tel.Inject(ctx, call))
		return err
	}))
	submitSpan.End()
	require.True(t, res.Created)
	require.Nil(t, call.Metadata, "Inject must not change the caller's call")

	// The key is the call's, whatever the trace: a duplicate from another
	// trace replays instead of conflicting.
	plainKey, err := outbox.DeriveKey(call)
	require.NoError(t, err)
	require.Equal(t, plainKey, res.Key)
	otherCtx, otherSpan := bundle.tracer.Tracer("test").Start(context.Background(), "retry")
	dup, err := submitter.Submit(otherCtx, bundle.tel.Inject(otherCtx, call))
	otherSpan.End()
	require.NoError(t, err)
	require.False(t, dup.Created)
	require.Equal(t, res.Key, dup.Key)

	// The runner: another client, as another process would have, with the
	// telemetry middleware, and a dispatcher whose context has no span.
	runRegistry := outbox.NewRegistry()
	require.NoError(t, runRegistry.Register("refund", bundle.refunds, outbox.IdempotentByKey))
	runner := driver.Client(t, outbox.Config{Schema: bundle.schema, Registry: runRegistry, Middleware: []outbox.Middleware{bundle.tel}})
	d, err := dispatcher.New(runner, dispatcher.Config{PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		require.NoError(t, <-done)
	})
	waitCtx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	final, err := runner.Wait(waitCtx, res.Key)
	require.NoError(t, err)
	require.Equal(t, outbox.StateSucceeded, final.State)

	var processed []sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool {
		processed = endedNamed(bundle.spans, "process refund")
		return len(processed) == 1
	}, time.Minute, 5*time.Millisecond)
	span := processed[0]
	submitted := submitSpan.SpanContext()
	require.Equal(t, trace.SpanKindConsumer, span.SpanKind())
	require.Equal(t, submitted.TraceID(), span.SpanContext().TraceID(), "the provider call joins the submitter's trace")
	require.Equal(t, submitted.SpanID(), span.Parent().SpanID())
	require.True(t, span.Parent().IsRemote())
	require.Len(t, span.Links(), 1)
	require.Equal(t, submitted.SpanID(), span.Links()[0].SpanContext.SpanID())
	got := attrs(span.Attributes())
	require.Equal(t, string(res.Key), got[telemetry.AttrKey].AsString())
	require.Equal(t, "refund", got[telemetry.AttrTool].AsString())
	require.Equal(t, int64(1), got[telemetry.AttrAttempt].AsInt64())
	require.Equal(t, "idempotent_by_key", got[telemetry.AttrDelivery].AsString())
	require.Equal(t, "succeeded", got[telemetry.AttrOutcome].AsString())
	require.Equal(t, "pgonce", got["messaging.system"].AsString())
	require.Equal(t, "refund", got["messaging.destination.name"].AsString())
	require.Equal(t, codes.Unset, span.Status().Code)
}

func TestProviderCallMetricsByOutcome(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testProviderCallMetricsByOutcome[pgx.Tx], testProviderCallMetricsByOutcome[*sql.Tx])
}

type lookupProvider struct{ found bool }

func (*lookupProvider) Call(context.Context, outbox.Request) (json.RawMessage, error) {
	return nil, outbox.Ambiguous(errors.New("timeout after send"))
}

func (p *lookupProvider) Lookup(context.Context, outbox.Request) (json.RawMessage, bool, error) {
	return json.RawMessage(`{}`), p.found, nil
}

func testProviderCallMetricsByOutcome[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()
	bundle := setup(t)
	registry := outbox.NewRegistry()
	var fail error
	require.NoError(t, registry.Register("refund", outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
		return json.RawMessage(`{}`), fail
	}), outbox.IdempotentByKey))
	require.NoError(t, registry.Register("email", outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
		return nil, outbox.Ambiguous(errors.New("timeout after send"))
	}), outbox.AtMostOnce))
	lookup := &lookupProvider{}
	require.NoError(t, registry.Register("provision", lookup, outbox.LookupByNaturalID))
	client := driver.Client(t, outbox.Config{Schema: bundle.schema, Registry: registry, Middleware: []outbox.Middleware{bundle.tel}})

	do := func(call outbox.Call) {
		t.Helper()
		_, _ = client.Do(t.Context(), call, nil)
	}
	do(outbox.Call{RunID: "r", Step: 1, Tool: "refund", Args: 1}) // succeeded
	fail = outbox.Permanent(errors.New("card declined"))
	do(outbox.Call{RunID: "r", Step: 2, Tool: "refund", Args: 2}) // failed
	fail = errors.New("503")
	do(outbox.Call{RunID: "r", Step: 3, Tool: "refund", Args: 3}) // retry
	fail = outbox.Ambiguous(errors.New("timeout"))
	do(outbox.Call{RunID: "r", Step: 4, Tool: "refund", Args: 4}) // ambiguous
	do(outbox.Call{RunID: "r", Step: 5, Tool: "email", Args: 5})  // needs_review
	provision := outbox.Call{RunID: "r", Step: 6, Tool: "provision", NaturalID: "vm-1", Args: 6}
	do(provision) // ambiguous
	do(provision) // lookup: not_found, then the call: ambiguous
	lookup.found = true
	do(provision) // lookup: found

	var rm metricdata.ResourceMetrics
	require.NoError(t, bundle.reader.Collect(t.Context(), &rm))
	type series struct{ tool, op, outcome string }
	counts := map[series]int64{}
	durations := map[series]uint64{}
	for _, scope := range rm.ScopeMetrics {
		require.Equal(t, telemetry.ScopeName, scope.Scope.Name)
		for _, m := range scope.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				require.Equal(t, telemetry.MetricProviderCalls, m.Name)
				require.Equal(t, "{call}", m.Unit)
				for _, dp := range data.DataPoints {
					counts[seriesOf(dp.Attributes)] += dp.Value
				}
			case metricdata.Histogram[float64]:
				require.Equal(t, telemetry.MetricProviderCallDuration, m.Name)
				require.Equal(t, "s", m.Unit)
				for _, dp := range data.DataPoints {
					durations[seriesOf(dp.Attributes)] += dp.Count
				}
			}
		}
	}
	want := map[series]int64{
		{"refund", "call", "succeeded"}:      1,
		{"refund", "call", "failed"}:         1,
		{"refund", "call", "retry"}:          1,
		{"refund", "call", "ambiguous"}:      1,
		{"email", "call", "needs_review"}:    1,
		{"provision", "call", "ambiguous"}:   2,
		{"provision", "lookup", "not_found"}: 1,
		{"provision", "lookup", "found"}:     1,
	}
	require.Equal(t, want, counts)
	for _, span := range endedNamed(bundle.spans, "lookup provision") {
		require.Equal(t, "vm-1", attrs(span.Attributes())[telemetry.AttrNaturalID].AsString())
	}
	for s, n := range want {
		require.Equal(t, uint64(n), durations[s], "%v", s)
	}

	// Every span carries its outcome, and failures set an error status.
	for _, span := range bundle.spans.Ended() {
		outcome := attrs(span.Attributes())[telemetry.AttrOutcome].AsString()
		switch outcome {
		case "succeeded", "found", "not_found":
			require.Equal(t, codes.Unset, span.Status().Code, span.Name())
		default:
			require.Equal(t, codes.Error, span.Status().Code, span.Name())
		}
	}
}

func seriesOf(set attribute.Set) (s struct{ tool, op, outcome string }) {
	tool, _ := set.Value(telemetry.AttrTool)
	op, _ := set.Value(telemetry.AttrOp)
	outcome, _ := set.Value(telemetry.AttrOutcome)
	s.tool, s.op, s.outcome = tool.AsString(), op.AsString(), outcome.AsString()
	return s
}
