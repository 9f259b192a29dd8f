package telemetry_test

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/trace"

	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/telemetry"
)

// ExampleTelemetry_Inject carries the submitter's trace context in the call's
// metadata, leaving its key alone. (An application's span would come from
// its SDK's tracer; a fixed span context stands in for it here.)
func ExampleTelemetry_Inject() {
	tel, err := telemetry.New(telemetry.Config{})
	if err != nil {
		panic(err)
	}
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
	}))
	call := outbox.Call{RunID: "run_01J9Z", Step: 3, Tool: "refund", Args: map[string]any{"order": 8842}}

	traced := tel.Inject(ctx, call)
	fmt.Println("traceparent:", traced.Metadata["traceparent"])

	plain, _ := outbox.DeriveKey(call)
	withTrace, _ := outbox.DeriveKey(traced)
	fmt.Println("same key:", plain == withTrace)

	// Output:
	// traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
	// same key: true
}
