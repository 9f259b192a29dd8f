package telemetry

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgonce/pgonce/internal/observe"
	"github.com/pgonce/pgonce/outbox"
)

// ScopeName is the instrumentation scope of pgonce's tracer and meter.
const ScopeName = "github.com/pgonce/pgonce/telemetry"

// Metric names.
const (
	// MetricProviderCalls counts provider calls and lookups, by pgonce.tool,
	// pgonce.op and pgonce.outcome. Unit {call}.
	MetricProviderCalls = "pgonce.provider.calls"
	// MetricProviderCallDuration is the duration of provider calls and
	// lookups, by pgonce.tool, pgonce.op and pgonce.outcome. Unit s.
	MetricProviderCallDuration = "pgonce.provider.call.duration"
	// MetricSubmits counts the submits and Dos of a [Client], by
	// pgonce.tool, pgonce.op ("submit" or "do") and pgonce.outcome
	// (created, replayed, in_progress, conflict, expired, error; for a Do
	// the key's state, or retry). Unit {submit}.
	MetricSubmits = "pgonce.submits"
	// MetricPruned counts what a [Client]'s prunes removed, by pgonce.op:
	// "tombstone" for finished keys turned into tombstones, "delete" for
	// tombstones deleted. Unit {key}.
	MetricPruned = "pgonce.pruned"
	// MetricResolutions counts the expired rows the reconcilers over a
	// client resolved, by pgonce.tool and pgonce.outcome (requeued, found,
	// needs_review, lookup_failed, failed, superseded). Unit {key}.
	MetricResolutions = "pgonce.reconciler.resolutions"
	// MetricClaimDuration is the duration of dispatchers' claim batches.
	// Unit s.
	MetricClaimDuration = "pgonce.claim.duration"
	// MetricClaimSize is the number of keys a dispatcher's claim batch
	// took, idle polls' zeros included. Unit {key}.
	MetricClaimSize = "pgonce.claim.batch.size"
	// MetricCommitToCall is how long each key a dispatcher claimed had
	// been due when the claim took it, by pgonce.tool, by the database's
	// clock: for a first attempt, from its submit (the submitting
	// transaction's start, so it includes the rest of that transaction) to
	// the claim that hands it to a provider call; for a retry, from the end
	// of its backoff. Unit s.
	MetricCommitToCall = "pgonce.commit_to_call.duration"
	// MetricRecordDuration is the duration of dispatchers' record batches.
	// Unit s.
	MetricRecordDuration = "pgonce.record.duration"
	// MetricRecordSize is the number of outcomes a dispatcher's record
	// batch wrote at once. Unit {key}.
	MetricRecordSize = "pgonce.record.batch.size"
	// MetricKeyCount is the number of keys pending, in flight and needing
	// review, by db.namespace (the schema), pgonce.tool and pgonce.state
	// ("pending", "in_flight", "needs_review"), as the dispatcher elected to
	// run maintenance reads them every maintenance interval; only that
	// process reports them. Unit {key}.
	MetricKeyCount = "pgonce.key.count"
	// MetricOldestPending is how long the oldest due pending key of each
	// tool has waited, by db.namespace and pgonce.tool, reported as
	// [MetricKeyCount] is. Unit s.
	MetricOldestPending = "pgonce.key.oldest_pending_age"
	// MetricClaimsHeld counts the claims that left a tool's due keys
	// waiting for its flow control, by pgonce.tool and pgonce.outcome:
	// "paused" (an operator paused the tool), "slowed_down" (its provider
	// asked to slow down) or "limited" (its limit on calls in flight or its
	// rate). Unit {claim}.
	MetricClaimsHeld = "pgonce.claim.held"
	// MetricToolPaused is 1 for each tool an operator paused and 0 for
	// every other tool the elected dispatcher serves, by db.namespace and
	// pgonce.tool, reported as [MetricKeyCount] is: its sum is the number
	// of paused tools. Unit {tool}.
	MetricToolPaused = "pgonce.tool.paused"
)

// Attribute keys of pgonce's spans and metrics.
const (
	// AttrKey is the call's key; on a provider call's span, also the key
	// the provider received to pass downstream.
	AttrKey = attribute.Key("pgonce.key")
	// AttrDownstreamKey, on a provider call's span, is the key the provider
	// sent downstream when it is not the call's own: httpprovider sets it
	// when its KeyFunc (Truncate, HexOnly) transforms the key.
	AttrDownstreamKey = attribute.Key("pgonce.downstream_key")
	AttrTool          = attribute.Key("pgonce.tool")
	AttrAttempt       = attribute.Key("pgonce.attempt")
	AttrDelivery      = attribute.Key("pgonce.delivery")
	AttrOp            = attribute.Key("pgonce.op")
	AttrOutcome       = attribute.Key("pgonce.outcome")
	// AttrNaturalID is the call's natural id, set when it has one: what a
	// lookup asks the provider about.
	AttrNaturalID = attribute.Key("pgonce.natural_id")
)

// Config configures a [Telemetry]. Its zero value works.
type Config struct {
	// TracerProvider makes the tracer of pgonce's spans. Defaults to the
	// global one, otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// MeterProvider makes the meter of pgonce's instruments. Defaults to
	// the global one, otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Propagator writes the submitter's trace context into a call's
	// metadata ([Telemetry.Inject]) and reads it back at the provider call.
	// Defaults to W3C Trace Context (propagation.TraceContext), which adds
	// the entries "traceparent" and, when set, "tracestate".
	Propagator propagation.TextMapPropagator
}

// Telemetry traces and measures provider calls: an [outbox.Middleware].
// Among a client's [outbox.Config.Middleware] (the first Telemetry there, if
// several are), it also traces and measures the work of the client's
// dispatchers, reconcilers and operators: claim and record batches,
// reconcile runs, prunes, resolves, cancels and retries, and the key gauges
// of an elected dispatcher. It is safe for concurrent use; its gauges stay
// registered with the meter for as long as the meter lives.
type Telemetry struct {
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
	calls      metric.Int64Counter
	duration   metric.Float64Histogram
	submits    metric.Int64Counter
	pruned     metric.Int64Counter

	resolutions    metric.Int64Counter
	claimsHeld     metric.Int64Counter
	commitToCall   metric.Float64Histogram
	claimDuration  metric.Float64Histogram
	claimSize      metric.Int64Histogram
	recordDuration metric.Float64Histogram
	recordSize     metric.Int64Histogram
	keyCount       metric.Int64ObservableUpDownCounter
	oldestPending  metric.Float64ObservableGauge
	toolPaused     metric.Int64ObservableGauge

	// gauges holds, by schema, the readings for keyCount and
	// oldestPending of the dispatchers of this process that lead.
	gauges   map[string]*observe.Gauges
	gaugesMu sync.Mutex

	// tools holds the telemetry of each tool seen so far; toolsMu orders
	// its replacements.
	tools   atomic.Pointer[map[string]*toolTelemetry]
	toolsMu sync.Mutex

	// observerSource makes this Telemetry the observer of the clients
	// whose middleware it is.
	observerSource
}

var _ outbox.Middleware = (*Telemetry)(nil)

// New returns a Telemetry over config's providers. It returns an error when
// the meter refuses an instrument.
func New(config Config) (*Telemetry, error) {
	if config.TracerProvider == nil {
		config.TracerProvider = otel.GetTracerProvider()
	}
	if config.MeterProvider == nil {
		config.MeterProvider = otel.GetMeterProvider()
	}
	if config.Propagator == nil {
		config.Propagator = propagation.TraceContext{}
	}
	meter := config.MeterProvider.Meter(ScopeName)
	tel := &Telemetry{
		tracer:     config.TracerProvider.Tracer(ScopeName),
		propagator: config.Propagator,
	}
	var errs []error
	counter := func(name, unit, description string) metric.Int64Counter {
		c, err := meter.Int64Counter(name, metric.WithDescription(description), metric.WithUnit(unit))
		if err != nil {
			errs = append(errs, fmt.Errorf("telemetry: %s: %w", name, err))
		}
		return c
	}
	seconds := func(name, description string) metric.Float64Histogram {
		h, err := meter.Float64Histogram(name, metric.WithDescription(description), metric.WithUnit("s"),
			metric.WithExplicitBucketBoundaries(durationBuckets...))
		if err != nil {
			errs = append(errs, fmt.Errorf("telemetry: %s: %w", name, err))
		}
		return h
	}
	sizes := func(name, description string) metric.Int64Histogram {
		h, err := meter.Int64Histogram(name, metric.WithDescription(description), metric.WithUnit("{key}"),
			metric.WithExplicitBucketBoundaries(batchBuckets...))
		if err != nil {
			errs = append(errs, fmt.Errorf("telemetry: %s: %w", name, err))
		}
		return h
	}
	tel.calls = counter(MetricProviderCalls, "{call}", "Provider calls and lookups made by pgonce, by outcome.")
	tel.duration = seconds(MetricProviderCallDuration, "Duration of provider calls and lookups made by pgonce.")
	tel.submits = counter(MetricSubmits, "{submit}", "Submits and Dos of pgonce keys, by outcome.")
	tel.pruned = counter(MetricPruned, "{key}", "Keys turned into tombstones and tombstones deleted by pgonce's pruning.")
	tel.resolutions = counter(MetricResolutions, "{key}", "Expired in-flight keys resolved by pgonce's reconcilers, by outcome.")
	tel.claimsHeld = counter(MetricClaimsHeld, "{claim}", "Claims that left a tool's due keys waiting for its flow control (pause, slow-down, limits).")
	tel.commitToCall = seconds(MetricCommitToCall, "How long keys were due before a dispatcher claimed them for a provider call.")
	tel.claimDuration = seconds(MetricClaimDuration, "Duration of pgonce dispatchers' claim batches.")
	tel.claimSize = sizes(MetricClaimSize, "Keys claimed by a pgonce dispatcher's claim batch.")
	tel.recordDuration = seconds(MetricRecordDuration, "Duration of pgonce dispatchers' record batches.")
	tel.recordSize = sizes(MetricRecordSize, "Outcomes written by a pgonce dispatcher's record batch.")
	var err error
	if tel.keyCount, err = meter.Int64ObservableUpDownCounter(MetricKeyCount, metric.WithUnit("{key}"),
		metric.WithDescription("Keys pending, in flight and needing review, as the elected pgonce dispatcher reads them.")); err != nil {
		errs = append(errs, fmt.Errorf("telemetry: %s: %w", MetricKeyCount, err))
	}
	if tel.oldestPending, err = meter.Float64ObservableGauge(MetricOldestPending, metric.WithUnit("s"),
		metric.WithDescription("How long the oldest due pending key of each tool has waited, as the elected pgonce dispatcher reads it.")); err != nil {
		errs = append(errs, fmt.Errorf("telemetry: %s: %w", MetricOldestPending, err))
	}
	if tel.toolPaused, err = meter.Int64ObservableGauge(MetricToolPaused, metric.WithUnit("{tool}"),
		metric.WithDescription("1 for each tool an operator paused, 0 for the others, as the elected pgonce dispatcher reads them.")); err != nil {
		errs = append(errs, fmt.Errorf("telemetry: %s: %w", MetricToolPaused, err))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	tel.gauges = map[string]*observe.Gauges{}
	if _, err := meter.RegisterCallback(tel.observeGauges, tel.keyCount, tel.oldestPending, tel.toolPaused); err != nil {
		return nil, fmt.Errorf("telemetry: gauges: %w", err)
	}
	tel.tools.Store(&map[string]*toolTelemetry{})
	tel.observerSource = observe.NewSource((*observer)(tel))
	return tel, nil
}

// Bucket boundaries of the duration histograms (the semantic conventions'
// for durations in seconds) and of the batch sizes.
var (
	durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}
	batchBuckets    = []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}
)

// Inject returns call with the trace context of ctx added to a copy of its
// metadata, for the provider call's span to join; call itself is not
// changed, and neither is its key, which metadata is no part of. Without a
// valid span in ctx it returns call as it is.
//
// Metadata entries the propagator writes ("traceparent", "tracestate")
// replace the caller's of the same names. An invalid result (metadata over
// [outbox.MetadataMaxEntries]) is refused by the submit as any other.
func (t *Telemetry) Inject(ctx context.Context, call outbox.Call) outbox.Call {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return call
	}
	metadata := maps.Clone(call.Metadata)
	if metadata == nil {
		metadata = make(map[string]string, 2)
	}
	t.propagator.Inject(ctx, propagation.MapCarrier(metadata))
	call.Metadata = metadata
	return call
}

// AroundProvider runs one provider call or lookup in a span and measures it.
// It implements [outbox.Middleware].
//
// The span's attributes are set when the call returns, in one go: a sampler
// sees the span's name and kind, not its attributes. A span that is not
// recording gets none.
func (t *Telemetry) AroundProvider(ctx context.Context, call *outbox.ProviderCall, next func(ctx context.Context) outbox.ProviderResult) outbox.ProviderResult {
	req := &call.Request
	tool := t.tool(req.Tool)
	name, op := tool.process, opCall
	if call.Op == outbox.ProviderOpLookup {
		name, op = tool.lookup, opLookup
	}
	parent, start := ctx, consumerStart
	if len(req.Metadata) > 0 {
		submitted := t.propagator.Extract(context.Background(), propagation.MapCarrier(req.Metadata))
		if sc := trace.SpanContextFromContext(submitted); sc.IsValid() {
			start = []trace.SpanStartOption{consumerKind, trace.WithLinks(trace.Link{SpanContext: sc})}
			if !trace.SpanContextFromContext(ctx).IsValid() {
				// Nothing in this process is tracing the call: join the
				// submitter's trace as the conventions allow for a message
				// processed alone.
				parent = trace.ContextWithRemoteSpanContext(ctx, sc)
			}
		}
	}
	// parent derives from ctx, so the call keeps its deadline and values.
	ctx, span := t.tracer.Start(parent, name, start...)
	began := time.Now()
	res := next(ctx)
	elapsed := time.Since(began)

	if span.IsRecording() {
		t.endProviderSpan(span, call, op, res)
	}
	span.End()
	// Measurements outlive a cancelled call: record them regardless.
	mctx := ctx
	if ctx.Err() != nil {
		mctx = context.WithoutCancel(ctx)
	}
	measure := tool.measurement(op, res.Outcome)
	t.calls.Add(mctx, 1, measure)
	t.duration.Record(mctx, elapsed.Seconds(), measure)
	return res
}

// endProviderSpan sets a provider span's attributes and status, all in one
// call: the SDK then grows the span's attributes once.
func (*Telemetry) endProviderSpan(span trace.Span, call *outbox.ProviderCall, op int, res outbox.ProviderResult) {
	req := &call.Request
	// Eight attributes on the way of a call that succeeds: the SDK then
	// deduplicates them without allocating.
	buf := attrBuffers.Get().(*[10]attribute.KeyValue)
	defer func() {
		clear(buf[:])
		attrBuffers.Put(buf)
	}()
	attrs := append(buf[:0],
		messagingSystem,
		opNames[op],
		semconv.MessagingDestinationName(req.Tool),
		AttrKey.String(string(req.Key)),
		AttrTool.String(req.Tool),
		AttrAttempt.Int(req.Attempt),
		AttrDelivery.String(call.Delivery.String()),
		AttrOutcome.String(string(res.Outcome)),
	)
	if req.NaturalID != "" {
		attrs = append(attrs, AttrNaturalID.String(req.NaturalID))
	}
	switch res.Outcome {
	case outbox.ProviderSucceeded, outbox.ProviderFound, outbox.ProviderNotFound:
		span.SetAttributes(attrs...)
		return
	}
	span.SetAttributes(append(attrs, semconv.ErrorTypeKey.String(string(res.Outcome)))...)
	if res.Err != nil {
		span.RecordError(res.Err)
		span.SetStatus(codes.Error, res.Err.Error())
	} else {
		span.SetStatus(codes.Error, string(res.Outcome))
	}
}

// attrBuffers holds the buffers of provider spans' attributes, which the
// span copies: a buffer on the stack would escape through the span's
// interface.
var attrBuffers = sync.Pool{New: func() any { return new([10]attribute.KeyValue) }}

// Provider operations, as indexes.
const (
	opCall = iota
	opLookup
)

// What every provider span shares, made once.
var (
	consumerKind    = trace.WithSpanKind(trace.SpanKindConsumer)
	consumerStart   = []trace.SpanStartOption{consumerKind}
	messagingSystem = semconv.MessagingSystemKey.String("pgonce")
	opNames         = [2]attribute.KeyValue{
		semconv.MessagingOperationName(outbox.ProviderOpCall.String()),
		semconv.MessagingOperationName(outbox.ProviderOpLookup.String()),
	}
)

// providerOutcomes are the outcomes a provider call or lookup can have, in
// the order of [toolTelemetry.measurements].
var providerOutcomes = [...]outbox.ProviderOutcome{
	outbox.ProviderSucceeded,
	outbox.ProviderFailed,
	outbox.ProviderRetry,
	outbox.ProviderAmbiguous,
	outbox.ProviderNeedsReview,
	outbox.ProviderFound,
	outbox.ProviderNotFound,
}

// toolTelemetry is what the spans and measurements of one tool's calls
// share, made once per tool: span names and the attribute sets of its
// measurements, by operation and outcome.
type toolTelemetry struct {
	name         string
	process      string
	lookup       string
	measurements [2][len(providerOutcomes)]metric.MeasurementOption
	// toolOnly is the attribute set of the tool alone.
	toolOnly metric.MeasurementOption
}

func newToolTelemetry(name string) *toolTelemetry {
	tool := &toolTelemetry{
		name: name, process: "process " + name, lookup: "lookup " + name,
		toolOnly: metric.WithAttributeSet(attribute.NewSet(AttrTool.String(name))),
	}
	for op, opName := range [2]string{outbox.ProviderOpCall.String(), outbox.ProviderOpLookup.String()} {
		for i, outcome := range providerOutcomes {
			tool.measurements[op][i] = measurementOf(name, opName, outcome)
		}
	}
	return tool
}

func measurementOf(tool, op string, outcome outbox.ProviderOutcome) metric.MeasurementOption {
	return metric.WithAttributeSet(attribute.NewSet(
		AttrTool.String(tool),
		AttrOp.String(op),
		AttrOutcome.String(string(outcome)),
	))
}

// measurement returns the attributes of a measurement of op with outcome.
func (tool *toolTelemetry) measurement(op int, outcome outbox.ProviderOutcome) metric.MeasurementOption {
	for i, known := range providerOutcomes {
		if known == outcome {
			return tool.measurements[op][i]
		}
	}
	return measurementOf(tool.name, opNames[op].Value.AsString(), outcome)
}

// tool returns the telemetry of the tool named name, made on its first
// call. Reads take no lock: the map is replaced, never changed.
func (t *Telemetry) tool(name string) *toolTelemetry {
	if tool, ok := (*t.tools.Load())[name]; ok {
		return tool
	}
	t.toolsMu.Lock()
	defer t.toolsMu.Unlock()
	tools := *t.tools.Load()
	if tool, ok := tools[name]; ok {
		return tool
	}
	tool := newToolTelemetry(name)
	grown := make(map[string]*toolTelemetry, len(tools)+1)
	maps.Copy(grown, tools)
	grown[name] = tool
	t.tools.Store(&grown)
	return tool
}
