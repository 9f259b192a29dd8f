// Package telemetry traces and measures pgonce's provider calls with
// OpenTelemetry. It depends only on the OpenTelemetry API: the application
// brings the SDK and its exporters, and passes its providers in [Config]
// (or sets the global ones).
//
// # Setup
//
// A [Telemetry] is an [outbox.Middleware]. Register it on the client that
// runs the calls, whether by [outbox.Client.Do], a dispatcher or a
// reconciler:
//
//	tel, err := telemetry.New(telemetry.Config{TracerProvider: tp, MeterProvider: mp})
//	if err != nil {
//		return err
//	}
//	client, err := outbox.NewPgx(pool, outbox.Config{Registry: registry, Middleware: []outbox.Middleware{tel}})
//
// # One trace from the submitter to the provider
//
// The submitter's trace context travels with the call in its
// [outbox.Call.Metadata], never in its key: [Telemetry.Inject] adds it
// before a submit.
//
//	res, err := client.SubmitTx(ctx, tx, tel.Inject(ctx, call))
//
// The provider call's span, made hours later in another process perhaps,
// then links to the submitter's span, and is its child when nothing else
// is running a span in the calling context (a dispatcher's, typically), so
// that it joins the submitter's trace.
//
// [Traced] wraps a client so that its submits, Dos, Waits and prunes run in
// spans ("send <tool>", a producer span; "do <tool>"; "wait"; "prune") and
// are counted ([MetricSubmits], [MetricPruned]), and its submits inject the trace context themselves:
//
//	traced := telemetry.Traced(client, tel)
//	res, err := traced.SubmitTx(ctx, tx, call)
//
// # Spans
//
// Each provider call is a span of kind consumer named "process <tool>", and
// each lookup one named "lookup <tool>", with the messaging attributes of the
// semantic conventions (messaging.system "pgonce", messaging.operation.name
// "call" or "lookup", messaging.destination.name the tool) and pgonce.key
// (the key the provider received, to pass downstream), pgonce.tool,
// pgonce.attempt, pgonce.delivery and pgonce.outcome (and pgonce.natural_id
// for a call with one). An outcome other than succeeded, found or not_found
// sets the span's status to error, with error.type. The attributes are set
// when the call returns: a sampler sees the span's name and kind only.
//
// A client with the Telemetry among its middleware also makes spans of the
// work around the calls: "claim" and "record" for its dispatchers' batches
// (of kind client, linked to the span that submitted each key; a poll that
// claims nothing makes none), "reconcile" for a reconcile run (the parent of
// its lookups and prune), "prune", and "resolve", "cancel" and "retry" for an
// operator's actions, children of the caller's span.
//
// # Metrics
//
// The instruments are named in [MetricProviderCalls],
// [MetricProviderCallDuration], [MetricSubmits], [MetricPruned],
// [MetricResolutions], [MetricClaimDuration], [MetricClaimSize],
// [MetricRecordDuration], [MetricRecordSize], [MetricKeyCount] and
// [MetricOldestPending]; their attributes are pgonce.tool, pgonce.op,
// pgonce.outcome and pgonce.state where they apply. The last two are
// observed by the process whose dispatcher is elected to run maintenance,
// and by no other.
package telemetry
