package main

import (
	"context"

	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgonce/pgonce/telemetry"
)

// demoTracing is the demo's tracing under --trace: a [telemetry.Telemetry]
// over an in-memory span recorder, and the span of the agent's run, the
// root of the refund's trace.
type demoTracing struct {
	recorder *spanRecorder
	tel      *telemetry.Telemetry
	root     *recordedSpan
}

func newDemoTracing(ctx context.Context) (*demoTracing, error) {
	recorder := &spanRecorder{}
	tel, err := telemetry.New(telemetry.Config{TracerProvider: recorder, MeterProvider: metricnoop.NewMeterProvider()})
	if err != nil {
		return nil, err
	}
	_, root := recorder.Tracer("").Start(ctx, "agent run-8842")
	return &demoTracing{recorder: recorder, tel: tel, root: root.(*recordedSpan)}, nil
}

// within returns ctx in the agent's run; a nil tracing returns ctx.
func (tr *demoTracing) within(ctx context.Context) context.Context {
	if tr == nil {
		return ctx
	}
	return trace.ContextWithSpan(ctx, tr.root)
}

// ask returns the context of one of the model's asks and the function that
// ends it.
func (tr *demoTracing) ask(ctx context.Context) (context.Context, func()) {
	if tr == nil {
		return ctx, func() {}
	}
	ctx, span := tr.recorder.Tracer("").Start(tr.within(ctx), "model asks refund")
	return ctx, func() { span.End() }
}

// untraced returns ctx without the span it may carry: a dispatcher's, as
// in a process of its own.
func untraced(ctx context.Context) context.Context {
	return trace.ContextWithSpanContext(ctx, trace.SpanContext{})
}
