package sdktest_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/telemetry"
)

// BenchmarkAroundProvider measures the middleware's own cost per provider
// call over the SDK (every span sampled and batched to an exporter that
// drops them, metrics aggregated by a reader), without a database: its
// allocations per call do not depend on the machine's load.
func BenchmarkAroundProvider(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardExporter{}), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	b.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	tel, err := telemetry.New(telemetry.Config{TracerProvider: tp, MeterProvider: mp})
	require.NoError(b, err)
	call := &outbox.ProviderCall{
		Op:       outbox.ProviderOpCall,
		Request:  outbox.Request{Key: "k1:0123456789abcdef0123456789abcdef", Tool: "noop", Args: json.RawMessage(`{}`), Attempt: 1},
		Delivery: outbox.IdempotentByKey,
	}
	next := func(context.Context) outbox.ProviderResult {
		return outbox.ProviderResult{Response: json.RawMessage(`{}`), Outcome: outbox.ProviderSucceeded}
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		tel.AroundProvider(ctx, call, next)
	}
}
