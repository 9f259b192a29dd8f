package telemetry

import (
	"context"
	"encoding/json"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgonce/pgonce/internal/observe"
)

// observerSource is the handle through which a client finds, among its
// middleware, the first Telemetry, and observes its dispatchers',
// reconcilers' and operators' work through it; unexported, so that it stays
// out of Telemetry's documentation.
type observerSource = observe.Source

// Attributes of the batch, maintenance and operator spans.
const (
	// AttrBatchLimit is the most keys a claim could take.
	AttrBatchLimit = attribute.Key("pgonce.batch.limit")
	// AttrWritten counts the outcomes a record batch wrote; the others had
	// been recorded first by someone else.
	AttrWritten = attribute.Key("pgonce.written")
	// AttrExamined counts the expired rows a reconcile run took.
	AttrExamined = attribute.Key("pgonce.examined")
	// AttrAction is a resolve's action: succeeded, failed or retry.
	AttrAction = attribute.Key("pgonce.action")
	// AttrState is a key's state after an operator's resolve, cancel or
	// retry.
	AttrState = attribute.Key("pgonce.state")
)

// observer is a Telemetry as the client's observer.
type observer Telemetry

// Claimed makes a claim batch's span (when it claimed something or failed:
// an idle poll leaves no span) and measures it.
func (o *observer) Claimed(ctx context.Context, claim *observe.Claim) {
	t := (*Telemetry)(o)
	mctx := measureContext(ctx)
	t.claimDuration.Record(mctx, claim.Ended.Sub(claim.Began).Seconds())
	t.claimSize.Record(mctx, int64(len(claim.Keys)))
	for _, key := range claim.Keys {
		if key.Waited >= 0 {
			t.commitToCall.Record(mctx, key.Waited.Seconds(), t.tool(key.Tool).toolOnly)
		}
	}
	for _, held := range claim.Held {
		t.claimsHeld.Add(mctx, 1, metric.WithAttributes(AttrTool.String(held.Tool), AttrOutcome.String(held.Reason)))
	}
	if len(claim.Keys) == 0 && claim.Err == nil {
		return
	}
	t.batchSpan(ctx, "claim", "receive", claim.Began, claim.Ended, claim.Keys, claim.Err,
		AttrBatchLimit.Int(claim.Limit))
}

// Recorded makes a record batch's span and measures it.
func (o *observer) Recorded(ctx context.Context, rec *observe.Record) {
	t := (*Telemetry)(o)
	mctx := measureContext(ctx)
	t.recordDuration.Record(mctx, rec.Ended.Sub(rec.Began).Seconds())
	t.recordSize.Record(mctx, int64(len(rec.Keys)))
	t.batchSpan(ctx, "record", "settle", rec.Began, rec.Ended, rec.Keys, rec.Err,
		AttrWritten.Int(rec.Written))
}

// batchLinksMax is how many of its keys' submitters a batch span links to
// at most.
const batchLinksMax = 32

// batchSpan makes the span of a claim or record batch, of kind client,
// linked to the span that submitted each key (of the first batchLinksMax),
// when its call carries one.
func (t *Telemetry) batchSpan(ctx context.Context, name, opType string, began, ended time.Time, keys []observe.Key, err error, extra attribute.KeyValue) {
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithTimestamp(began),
		trace.WithAttributes(
			messagingSystem,
			semconv.MessagingOperationName(name),
			semconv.MessagingOperationTypeKey.String(opType),
			semconv.MessagingBatchMessageCount(len(keys)),
			extra,
		),
	}
	// Each link costs a decoding of the key's metadata: a big batch, whose
	// cost per key is small, links to the first batchLinksMax submitters.
	for _, key := range keys[:min(len(keys), batchLinksMax)] {
		if sc := t.submitterOf(key.Metadata); sc.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{AttrKey.String(key.Key)}}))
		}
	}
	_, span := t.tracer.Start(ctx, name, opts...)
	setError(span, err)
	span.End(trace.WithTimestamp(ended))
}

// StartReconcile starts a reconcile run's span; lookups the run makes are
// its children.
func (o *observer) StartReconcile(ctx context.Context) (context.Context, func(*observe.Reconciled)) {
	t := (*Telemetry)(o)
	ctx, span := t.tracer.Start(ctx, "reconcile")
	return ctx, func(done *observe.Reconciled) {
		defer span.End()
		resolved := 0
		mctx := measureContext(ctx)
		for _, r := range done.Resolutions {
			resolved += r.Count
			t.resolutions.Add(mctx, int64(r.Count), metric.WithAttributeSet(attribute.NewSet(
				AttrTool.String(r.Tool), AttrOutcome.String(r.Kind))))
		}
		span.SetAttributes(AttrExamined.Int(done.Examined), AttrResolved.Int(resolved))
		setError(span, done.Err)
	}
}

// StartPrune starts a prune's span, unless a [Client]'s Prune traces it
// already, and counts what it removed.
func (o *observer) StartPrune(ctx context.Context, dryRun bool) (context.Context, func(keys, tombstones int64, err error)) {
	if ctx.Value(pruneTracedKey{}) != nil {
		return ctx, func(int64, int64, error) {}
	}
	t := (*Telemetry)(o)
	ctx, span := t.tracer.Start(ctx, "prune")
	return ctx, func(keys, tombstones int64, err error) {
		t.endPrune(ctx, span, dryRun, keys, tombstones, err)
	}
}

// Operated makes the span of an operator's resolve, cancel or retry, a
// child of the caller's.
func (o *observer) Operated(ctx context.Context, op *observe.Operation) {
	t := (*Telemetry)(o)
	_, span := t.tracer.Start(ctx, op.Name, trace.WithTimestamp(op.Began), trace.WithAttributes(AttrKey.String(op.Key)))
	if op.Action != "" {
		span.SetAttributes(AttrAction.String(op.Action))
	}
	if op.State != "" {
		span.SetAttributes(AttrState.String(op.State))
	}
	setError(span, op.Err)
	span.End(trace.WithTimestamp(op.Ended))
}

// Gauged keeps the elected dispatcher's reading of its schema's keys for
// the gauges to report; nil forgets it.
func (o *observer) Gauged(_ context.Context, schema string, gauges *observe.Gauges) {
	t := (*Telemetry)(o)
	t.gaugesMu.Lock()
	defer t.gaugesMu.Unlock()
	if gauges == nil {
		delete(t.gauges, schema)
		return
	}
	t.gauges[schema] = gauges
}

// observeGauges reports the fresh readings of the schemas whose dispatcher
// in this process leads.
func (t *Telemetry) observeGauges(_ context.Context, o metric.Observer) error {
	now := time.Now()
	t.gaugesMu.Lock()
	defer t.gaugesMu.Unlock()
	for schema, gauges := range t.gauges {
		if now.After(gauges.Until) {
			continue
		}
		namespace := semconv.DBNamespace(schema)
		for _, tool := range gauges.Tools {
			for _, state := range [...]struct {
				name string
				n    int64
			}{
				{"pending", tool.Pending},
				{"in_flight", tool.InFlight},
				{"needs_review", tool.NeedsReview},
			} {
				o.ObserveInt64(t.keyCount, state.n, metric.WithAttributes(namespace, AttrTool.String(tool.Tool), AttrState.String(state.name)))
			}
			o.ObserveFloat64(t.oldestPending, tool.OldestPending.Seconds(), metric.WithAttributes(namespace, AttrTool.String(tool.Tool)))
			var paused int64
			if tool.Paused {
				paused = 1
			}
			o.ObserveInt64(t.toolPaused, paused, metric.WithAttributes(namespace, AttrTool.String(tool.Tool)))
		}
	}
	return nil
}

// AttrResolved counts the rows a reconcile run resolved.
const AttrResolved = attribute.Key("pgonce.resolved")

// pruneTracedKey marks the context of a [Client]'s Prune, which makes the
// prune's span itself.
type pruneTracedKey struct{}

// endPrune sets a prune span's attributes and status, ends it and counts
// what the prune removed, unless it was a dry run.
func (t *Telemetry) endPrune(ctx context.Context, span trace.Span, dryRun bool, keys, tombstones int64, err error) {
	defer span.End()
	span.SetAttributes(AttrPrunedKeys.Int64(keys), AttrDeletedTombstones.Int64(tombstones))
	setError(span, err)
	if dryRun {
		return
	}
	mctx := measureContext(ctx)
	t.pruned.Add(mctx, keys, prunedTombstone)
	t.pruned.Add(mctx, tombstones, prunedDelete)
}

var (
	prunedTombstone = metric.WithAttributeSet(attribute.NewSet(AttrOp.String("tombstone")))
	prunedDelete    = metric.WithAttributeSet(attribute.NewSet(AttrOp.String("delete")))
)

func setError(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
}

// measureContext returns ctx, or, when it is done, a context with its
// values that is not: the SDK drops measurements made under a done context.
func measureContext(ctx context.Context) context.Context {
	if ctx.Err() != nil {
		return context.WithoutCancel(ctx)
	}
	return ctx
}

// submitterOf returns the span context that metadata, a call's stored
// metadata, carries, or an invalid one.
func (t *Telemetry) submitterOf(metadata []byte) trace.SpanContext {
	if len(metadata) == 0 {
		return trace.SpanContext{}
	}
	var carrier map[string]string
	if json.Unmarshal(metadata, &carrier) != nil {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(t.propagator.Extract(context.Background(), propagation.MapCarrier(carrier)))
}
