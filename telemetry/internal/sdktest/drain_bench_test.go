package sdktest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/telemetry"
)

// discardExporter is an SDK span exporter that drops what it gets: the
// cost measured is the SDK's, not an exporter's.
type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }

const drainBenchRows = 2000

// drainBench is one side of [BenchmarkDrainTelemetry]: a client over a
// schema of its own whose no-op provider signals its drainBenchRows-th call.
type drainBench struct {
	schema  string
	client  *outbox.Client[pgx.Tx]
	calls   atomic.Int64
	want    atomic.Int64
	reached chan struct{}
}

func newDrainBench(b *testing.B, tel *telemetry.Telemetry) *drainBench {
	b.Helper()
	bench := &drainBench{schema: pgoncetest.Schema(b), reached: make(chan struct{}, 1)}
	registry := outbox.NewRegistry()
	require.NoError(b, registry.Register("noop", outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
		if bench.calls.Add(1) == bench.want.Load() {
			bench.reached <- struct{}{}
		}
		return json.RawMessage(`{}`), nil
	}), outbox.IdempotentByKey))
	config := outbox.Config{Schema: bench.schema, Registry: registry, Logger: slog.New(slog.DiscardHandler)}
	if tel != nil {
		config.Middleware = []outbox.Middleware{tel}
	}
	bench.client = drivertest.Pgx().Client(b, config)
	return bench
}

// drain submits drainBenchRows calls, then times one dispatcher draining
// them, outcomes recorded, and counts the process's heap allocations
// meanwhile.
func (bench *drainBench) drain(b *testing.B, round int) (time.Duration, uint64) {
	b.Helper()
	batch := make([]outbox.Call, drainBenchRows)
	for n := range batch {
		batch[n] = outbox.Call{RunID: fmt.Sprintf("drain/%d", round), Step: int64(n), Tool: "noop", Args: map[string]any{}}
	}
	drivertest.Pgx().SubmitAll(b, bench.client, batch)
	bench.want.Store(bench.calls.Load() + drainBenchRows)
	d, err := dispatcher.New(bench.client, dispatcher.Config{Concurrency: 64, BatchSize: 256, PollInterval: 10 * time.Millisecond})
	require.NoError(b, err)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	began := time.Now()
	go func() { done <- d.Run(ctx) }()
	<-bench.reached
	awaitDrained(b, bench.schema)
	elapsed := time.Since(began)
	runtime.ReadMemStats(&after)

	stop()
	require.NoError(b, <-done)
	return elapsed, after.Mallocs - before.Mallocs
}

// BenchmarkDrainTelemetry drains drainBenchRows no-op calls with one
// dispatcher without telemetry and with the telemetry middleware over the
// SDK (every span sampled and batched to an exporter that drops them,
// metrics aggregated by a reader), alternating the two in every iteration so
// that a busy machine slows both alike. It reports both throughputs and the
// overhead, the relative loss of throughput, and the heap allocations per
// call of each side (allocs/call-off, allocs/call-on), which unlike the
// throughputs do not depend on the machine's load.
func BenchmarkDrainTelemetry(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardExporter{}), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	b.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	tel, err := telemetry.New(telemetry.Config{TracerProvider: tp, MeterProvider: mp})
	require.NoError(b, err)
	off, on := newDrainBench(b, nil), newDrainBench(b, tel)

	var (
		offElapsed, onElapsed time.Duration
		offAllocs, onAllocs   uint64
	)
	drainOff := func(i int) {
		elapsed, allocs := off.drain(b, i)
		offElapsed += elapsed
		offAllocs += allocs
	}
	drainOn := func(i int) {
		elapsed, allocs := on.drain(b, i)
		onElapsed += elapsed
		onAllocs += allocs
	}
	b.ResetTimer()
	for i := range b.N {
		if i%2 == 0 {
			drainOff(i)
			drainOn(i)
		} else {
			drainOn(i)
			drainOff(i)
		}
	}
	offRate := float64(b.N*drainBenchRows) / offElapsed.Seconds()
	onRate := float64(b.N*drainBenchRows) / onElapsed.Seconds()
	b.ReportMetric(offRate, "calls/s-off")
	b.ReportMetric(onRate, "calls/s-on")
	b.ReportMetric(100*(offRate-onRate)/offRate, "overhead-%")
	b.ReportMetric(float64(offAllocs)/float64(b.N*drainBenchRows), "allocs/call-off")
	b.ReportMetric(float64(onAllocs)/float64(b.N*drainBenchRows), "allocs/call-on")
}

// awaitDrained waits until schema holds no open key: the last outcomes are
// recorded in a batch after their calls return.
func awaitDrained(b *testing.B, schema string) {
	b.Helper()
	for {
		var open int
		require.NoError(b, pgoncetest.Pool(b).QueryRow(context.Background(),
			`SELECT count(*) FROM "`+schema+`".pgonce_key WHERE state <> 'succeeded'`).Scan(&open))
		if open == 0 {
			return
		}
		time.Sleep(time.Millisecond)
	}
}
