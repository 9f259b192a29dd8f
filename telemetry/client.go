package telemetry

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgonce/pgonce/outbox"
)

// AttrReplayed is set on a submit's or a Do's span: whether its result
// replays an outcome that an earlier request created.
const AttrReplayed = attribute.Key("pgonce.replayed")

// Client is an [outbox.Client] whose submits, Dos, Waits and prunes run in
// spans and are counted, and whose submits carry their trace context to the provider
// call ([Telemetry.Inject]). Every other method is the embedded client's;
// pass the embedded client to dispatchers and reconcilers.
type Client[TTx any] struct {
	*outbox.Client[TTx]

	tel *Telemetry
}

// Traced returns client with its submits, Dos, Waits and prunes traced by
// tel.
func Traced[TTx any](client *outbox.Client[TTx], tel *Telemetry) *Client[TTx] {
	return &Client[TTx]{Client: client, tel: tel}
}

// SubmitTx is [outbox.Client.SubmitTx] in a span of kind producer named
// "send <tool>", a child of ctx's, whose context the call carries in its
// metadata. The span ends when SubmitTx returns, before tx commits: it
// times the submit, not the caller's transaction.
func (c *Client[TTx]) SubmitTx(ctx context.Context, tx TTx, call outbox.Call) (outbox.Result, error) {
	ctx, span := c.tel.startSubmit(ctx, call)
	res, err := c.Client.SubmitTx(ctx, tx, c.tel.Inject(ctx, call))
	c.tel.endSubmit(ctx, span, call, res, err)
	return res, err
}

// Submit is [outbox.Client.Submit] traced as [Client.SubmitTx] is.
func (c *Client[TTx]) Submit(ctx context.Context, call outbox.Call) (outbox.Result, error) {
	ctx, span := c.tel.startSubmit(ctx, call)
	res, err := c.Client.Submit(ctx, c.tel.Inject(ctx, call))
	c.tel.endSubmit(ctx, span, call, res, err)
	return res, err
}

// Do is [outbox.Client.Do] in a span named "do <tool>", a child of ctx's,
// whose context the call carries in its metadata: the provider call's span
// (from the client's [Telemetry] middleware) is its child, and a later
// attempt by a dispatcher links to it.
func (c *Client[TTx]) Do(ctx context.Context, call outbox.Call, p outbox.Provider) (outbox.Result, error) {
	ctx, span := c.tel.tracer.Start(ctx, "do "+call.Tool, trace.WithAttributes(AttrTool.String(call.Tool)))
	defer span.End()
	res, err := c.Client.Do(ctx, c.tel.Inject(ctx, call), p)
	outcome := doOutcome(res, err)
	c.tel.finish(ctx, span, res, err, outcome)
	c.tel.submits.Add(context.WithoutCancel(ctx), 1, metric.WithAttributeSet(attribute.NewSet(
		AttrTool.String(call.Tool), AttrOp.String("do"), AttrOutcome.String(outcome))))
	return res, err
}

// Wait is [outbox.Client.Wait] in a span named "wait", a child of ctx's.
func (c *Client[TTx]) Wait(ctx context.Context, key outbox.Key) (outbox.Result, error) {
	ctx, span := c.tel.tracer.Start(ctx, "wait", trace.WithAttributes(AttrKey.String(string(key))))
	defer span.End()
	res, err := c.Client.Wait(ctx, key)
	outcome := string(res.State)
	if err != nil {
		outcome = errorOutcome(err)
	}
	c.tel.finish(ctx, span, res, err, outcome)
	return res, err
}

func (t *Telemetry) startSubmit(ctx context.Context, call outbox.Call) (context.Context, trace.Span) {
	return t.tracer.Start(ctx, "send "+call.Tool,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			semconv.MessagingSystemKey.String("pgonce"),
			semconv.MessagingOperationName("send"),
			semconv.MessagingOperationTypeSend,
			semconv.MessagingDestinationName(call.Tool),
			AttrTool.String(call.Tool),
		))
}

func (t *Telemetry) endSubmit(ctx context.Context, span trace.Span, call outbox.Call, res outbox.Result, err error) {
	defer span.End()
	outcome := submitOutcome(res, err)
	if res.Key != "" {
		span.SetAttributes(semconv.MessagingMessageID(string(res.Key)))
	}
	t.finish(ctx, span, res, err, outcome)
	t.submits.Add(context.WithoutCancel(ctx), 1, metric.WithAttributeSet(attribute.NewSet(
		AttrTool.String(call.Tool), AttrOp.String("submit"), AttrOutcome.String(outcome))))
}

// finish sets a client span's outcome attributes and status.
func (*Telemetry) finish(_ context.Context, span trace.Span, res outbox.Result, err error, outcome string) {
	span.SetAttributes(AttrOutcome.String(outcome), AttrReplayed.Bool(res.Replayed()))
	if res.Key != "" {
		span.SetAttributes(AttrKey.String(string(res.Key)))
	}
	if err != nil && !errors.Is(err, outbox.ErrInProgress) {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(semconv.ErrorTypeKey.String(outcome))
	}
}

// Submit and Do outcomes, beside the provider outcomes of
// [outbox.ProviderOutcome].
const (
	outcomeCreated    = "created"
	outcomeReplayed   = "replayed"
	outcomeInProgress = "in_progress"
	outcomeConflict   = "conflict"
	outcomeExpired    = "expired"
	outcomeError      = "error"
)

func submitOutcome(res outbox.Result, err error) string {
	switch {
	case err != nil:
		return errorOutcome(err)
	case res.Created:
		return outcomeCreated
	case res.State.InProgress():
		return outcomeInProgress
	}
	return outcomeReplayed
}

func doOutcome(res outbox.Result, err error) string {
	switch {
	case errors.Is(err, outbox.ErrProviderFailed):
		return string(outbox.ProviderRetry)
	case err != nil:
		return errorOutcome(err)
	case res.Replayed():
		return outcomeReplayed
	}
	return string(res.State)
}

func errorOutcome(err error) string {
	switch {
	case errors.Is(err, outbox.ErrKeyConflict):
		return outcomeConflict
	case errors.Is(err, outbox.ErrExpired):
		return outcomeExpired
	case errors.Is(err, outbox.ErrInProgress):
		return outcomeInProgress
	}
	return outcomeError
}

// Prune is [outbox.Client.Prune] in a span named "prune", a child of ctx's,
// with the keys it turned into tombstones and the tombstones it deleted as
// attributes (pgonce.pruned_keys, pgonce.deleted_tombstones) and added to
// [MetricPruned] (unless opts asks for a dry run, which counts nothing). A
// client with the Telemetry among its middleware traces its prunes this way
// itself, those of its reconcilers included; this Prune then makes the one
// span.
func (c *Client[TTx]) Prune(ctx context.Context, opts *outbox.PruneOpts) (outbox.PruneResult, error) {
	ctx, span := c.tel.tracer.Start(ctx, "prune")
	res, err := c.Client.Prune(context.WithValue(ctx, pruneTracedKey{}, true), opts)
	c.tel.endPrune(ctx, span, opts != nil && opts.DryRun, res.Keys, res.Tombstones, err)
	return res, err
}

// Attributes of the prune span.
const (
	AttrPrunedKeys        = attribute.Key("pgonce.pruned_keys")
	AttrDeletedTombstones = attribute.Key("pgonce.deleted_tombstones")
)
