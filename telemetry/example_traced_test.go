package telemetry_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/pgonce/pgonce/internal/exampledb"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/telemetry"
)

// spanNames is a TracerProvider that remembers the names of the spans
// started, standing in for an application's OpenTelemetry SDK.
type spanNames struct {
	noop.TracerProvider
	mu    sync.Mutex
	names []string
}

func (p *spanNames) Tracer(string, ...trace.TracerOption) trace.Tracer { return namingTracer{p: p} }

type namingTracer struct {
	noop.Tracer
	p *spanNames
}

func (t namingTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	t.p.mu.Lock()
	t.p.names = append(t.p.names, name)
	t.p.mu.Unlock()
	return t.Tracer.Start(ctx, name, opts...)
}

// ExampleTraced wires telemetry into a service: the Telemetry is the
// client's middleware, so that every provider call is a span, whoever makes
// it (Do, a dispatcher, a reconciler), and Traced wraps the client, so that
// its submits, Dos, waits and prunes are spans too. The providers are the
// application's SDK's; here, one that keeps the spans' names.
func ExampleTraced() {
	ctx := context.Background()
	// A database and a migrated schema of the example's own.
	exampleDB, dropDB := exampledb.ForExample()
	defer dropDB()
	pool, schema := exampleDB.Pool, exampleDB.Schema

	spans := &spanNames{}
	tel, err := telemetry.New(telemetry.Config{TracerProvider: spans, MeterProvider: metricnoop.NewMeterProvider()})
	if err != nil {
		panic(err)
	}
	registry := outbox.NewRegistry()
	refunds := outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
		return json.RawMessage(`{"refund_id":"re_1"}`), nil
	})
	if err := registry.Register("refund", refunds, outbox.IdempotentByKey); err != nil {
		panic(err)
	}
	client, err := outbox.NewPgx(pool, outbox.Config{
		Schema:     schema,
		Registry:   registry,
		Middleware: []outbox.Middleware{tel},
	})
	if err != nil {
		panic(err)
	}
	traced := telemetry.Traced(client, tel)

	res, err := traced.Do(ctx, outbox.Call{RunID: "run-8842", Step: 1, Tool: "refund", Args: map[string]any{"order": 8842}}, nil)
	if err != nil {
		panic(err)
	}
	fmt.Println(res.State, string(res.Response))
	spans.mu.Lock()
	defer spans.mu.Unlock()
	fmt.Println(spans.names)

	// Output:
	// succeeded {"refund_id":"re_1"}
	// [do refund process refund]
}
