package pgonceanthropic

import (
	"context"

	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
)

// The attributes of the span a tool runner starts for each tool_use block it
// runs (OpenTelemetry's semantic conventions for generative AI): the
// operation, and the block's id.
const (
	attrOperationName = attribute.Key("gen_ai.operation.name")
	attrToolCallID    = attribute.Key("gen_ai.tool.call.id")
	opExecuteTool     = "execute_tool"
)

// toolUseIDKey is the context key of the id of the tool_use block a runner
// tool's call answers.
type toolUseIDKey struct{}

// RunnerOptions returns the request options that let the tools
// [Executor.RunnerTools] returns tell which tool_use block each call
// answers: pass them to NewToolRunner (or NewToolRunnerStreaming), after
// options of your own. A runner runs the tool calls of a message
// concurrently and gives a tool only its input, so identical blocks in one
// message (the same tool, the same input) are otherwise indistinguishable,
// and their results could be paired with each other's ids.
//
// The runner starts an OpenTelemetry span for each block it runs, which
// carries the block's id; the options send the runner's spans through a
// tracer provider that hands the id to the tool, and then on to provider.
// nil provider means the provider registered with OpenTelemetry, where the
// runner's spans go by default. The options keep the runner's spans on
// (option.WithOpenTelemetryTraces), over the ANTHROPIC_OPEN_TELEMETRY
// environment variable: to drop them, pass a no-op provider
// (go.opentelemetry.io/otel/trace/noop).
func RunnerOptions(provider trace.TracerProvider) []option.RequestOption {
	return []option.RequestOption{
		option.WithTracerProvider(toolUseTracerProvider{inner: provider}),
		option.WithOpenTelemetryTraces(true),
	}
}

// toolUseTracerProvider is a tracer provider whose tracers put the id of a
// tool_use block in the context of the span that runs it.
type toolUseTracerProvider struct {
	embedded.TracerProvider
	inner trace.TracerProvider // nil: the registered provider
}

// Tracer returns a tracer of the inner provider that hands tool_use ids on.
func (p toolUseTracerProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	inner := p.inner
	if inner == nil {
		inner = otel.GetTracerProvider()
	}
	return toolUseTracer{inner: inner.Tracer(name, opts...)}
}

// toolUseTracer is a tracer that puts the id of a tool_use block in the
// context of the span that runs it.
type toolUseTracer struct {
	embedded.Tracer
	inner trace.Tracer
}

// Start starts the span with the inner tracer and, for the span of a
// tool_use block, puts the block's id in the context it returns.
func (t toolUseTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	ctx, span := t.inner.Start(ctx, name, opts...)
	var op, id string
	config := trace.NewSpanStartConfig(opts...)
	for _, kv := range config.Attributes() {
		switch kv.Key {
		case attrOperationName:
			op = kv.Value.AsString()
		case attrToolCallID:
			id = kv.Value.AsString()
		}
	}
	if op == opExecuteTool && id != "" {
		ctx = context.WithValue(ctx, toolUseIDKey{}, id)
	}
	return ctx, span
}
