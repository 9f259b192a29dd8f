package telemetry

import (
	"context"
	"fmt"
	"maps"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

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
)

// Attribute keys of pgonce's spans and metrics.
const (
	AttrKey           = attribute.Key("pgonce.key")
	AttrTool          = attribute.Key("pgonce.tool")
	AttrAttempt       = attribute.Key("pgonce.attempt")
	AttrDelivery      = attribute.Key("pgonce.delivery")
	AttrOp            = attribute.Key("pgonce.op")
	AttrOutcome       = attribute.Key("pgonce.outcome")
	AttrDownstreamKey = attribute.Key("pgonce.downstream_key")
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
// It is safe for concurrent use.
type Telemetry struct {
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
	calls      metric.Int64Counter
	duration   metric.Float64Histogram
	submits    metric.Int64Counter
	pruned     metric.Int64Counter
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
	calls, err := meter.Int64Counter(MetricProviderCalls,
		metric.WithDescription("Provider calls and lookups made by pgonce, by outcome."),
		metric.WithUnit("{call}"))
	if err != nil {
		return nil, fmt.Errorf("telemetry: %s: %w", MetricProviderCalls, err)
	}
	duration, err := meter.Float64Histogram(MetricProviderCallDuration,
		metric.WithDescription("Duration of provider calls and lookups made by pgonce."),
		metric.WithUnit("s"))
	if err != nil {
		return nil, fmt.Errorf("telemetry: %s: %w", MetricProviderCallDuration, err)
	}
	submits, err := meter.Int64Counter(MetricSubmits,
		metric.WithDescription("Submits and Dos of pgonce keys, by outcome."),
		metric.WithUnit("{submit}"))
	if err != nil {
		return nil, fmt.Errorf("telemetry: %s: %w", MetricSubmits, err)
	}
	pruned, err := meter.Int64Counter(MetricPruned,
		metric.WithDescription("Keys turned into tombstones and tombstones deleted by pgonce's pruning."),
		metric.WithUnit("{key}"))
	if err != nil {
		return nil, fmt.Errorf("telemetry: %s: %w", MetricPruned, err)
	}
	return &Telemetry{
		tracer:     config.TracerProvider.Tracer(ScopeName),
		propagator: config.Propagator,
		calls:      calls,
		duration:   duration,
		submits:    submits,
		pruned:     pruned,
	}, nil
}

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
func (t *Telemetry) AroundProvider(ctx context.Context, call *outbox.ProviderCall, next func(ctx context.Context) outbox.ProviderResult) outbox.ProviderResult {
	req := call.Request
	op := call.Op.String()
	name := "process " + req.Tool
	if call.Op == outbox.ProviderOpLookup {
		name = "lookup " + req.Tool
	}
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			semconv.MessagingSystemKey.String("pgonce"),
			semconv.MessagingOperationName(op),
			semconv.MessagingOperationTypeProcess,
			semconv.MessagingDestinationName(req.Tool),
			semconv.MessagingMessageID(string(req.Key)),
			AttrKey.String(string(req.Key)),
			AttrTool.String(req.Tool),
			AttrAttempt.Int(req.Attempt),
			AttrDelivery.String(call.Delivery.String()),
			AttrOp.String(op),
			AttrDownstreamKey.String(string(req.Key)),
		),
	}
	if req.NaturalID != "" {
		opts = append(opts, trace.WithAttributes(AttrNaturalID.String(req.NaturalID)))
	}
	parent := ctx
	if len(req.Metadata) > 0 {
		submitted := t.propagator.Extract(context.Background(), propagation.MapCarrier(req.Metadata))
		if sc := trace.SpanContextFromContext(submitted); sc.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
			if !trace.SpanContextFromContext(ctx).IsValid() {
				// Nothing in this process is tracing the call: join the
				// submitter's trace as the conventions allow for a message
				// processed alone.
				parent = trace.ContextWithRemoteSpanContext(ctx, sc)
			}
		}
	}
	// parent derives from ctx, so the call keeps its deadline and values.
	ctx, span := t.tracer.Start(parent, name, opts...)
	defer span.End()

	start := time.Now()
	res := next(ctx)
	elapsed := time.Since(start)

	outcome := string(res.Outcome)
	span.SetAttributes(AttrOutcome.String(outcome))
	switch res.Outcome {
	case outbox.ProviderSucceeded, outbox.ProviderFound, outbox.ProviderNotFound:
	default:
		span.SetAttributes(semconv.ErrorTypeKey.String(outcome))
		if res.Err != nil {
			span.RecordError(res.Err)
			span.SetStatus(codes.Error, res.Err.Error())
		} else {
			span.SetStatus(codes.Error, outcome)
		}
	}
	attrs := metric.WithAttributeSet(attribute.NewSet(
		AttrTool.String(req.Tool),
		AttrOp.String(op),
		AttrOutcome.String(outcome),
	))
	// Measurements outlive a cancelled call: record them regardless.
	mctx := context.WithoutCancel(ctx)
	t.calls.Add(mctx, 1, attrs)
	t.duration.Record(mctx, elapsed.Seconds(), attrs)
	return res
}
