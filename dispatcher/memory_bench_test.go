package dispatcher_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

const (
	// memoryChildSchemaEnv, when set, makes the test binary a dispatcher
	// process for BenchmarkDrainMemory over that schema.
	memoryChildSchemaEnv = "PGONCE_BENCH_MEMORY_SCHEMA"
	// memoryChildConcurrencyEnv is the child's dispatcher.Config.Concurrency.
	memoryChildConcurrencyEnv = "PGONCE_BENCH_MEMORY_CONCURRENCY"

	// memoryConcurrency is the concurrency the memory budget is
	// stated for.
	memoryConcurrency = 256
)

// memoryReport is what a BenchmarkDrainMemory child prints when it stops:
// its Go allocations over the drain, and the calls it made.
type memoryReport struct {
	Calls  int64  `json:"calls"`
	Allocs uint64 `json:"allocs"`
	Bytes  uint64 `json:"bytes"`
}

// runMemoryChild is the body of BenchmarkDrainMemory's dispatcher process:
// it serves benchTool with a no-op provider at memoryConcurrency until
// SIGTERM, then prints a memoryReport on stdout.
func runMemoryChild() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "memory child:", err)
		return 1
	}
	pool, err := pgxpool.New(ctx, os.Getenv(childURLEnv))
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	var calls atomic.Int64
	registry := outbox.NewRegistry()
	provider := outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
		calls.Add(1)
		return json.RawMessage(`{}`), nil
	})
	if err := registry.Register(benchTool, provider, outbox.IdempotentByKey); err != nil {
		return fail(err)
	}
	client, err := outbox.NewPgx(pool, outbox.Config{Schema: os.Getenv(memoryChildSchemaEnv), Registry: registry})
	if err != nil {
		return fail(err)
	}
	concurrency, err := strconv.Atoi(os.Getenv(memoryChildConcurrencyEnv))
	if err != nil {
		return fail(err)
	}
	d, err := dispatcher.New(client, dispatcher.Config{Concurrency: concurrency})
	if err != nil {
		return fail(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if err := d.Run(ctx); err != nil {
		return fail(err)
	}
	runtime.ReadMemStats(&after)
	report := memoryReport{Calls: calls.Load(), Allocs: after.Mallocs - before.Mallocs, Bytes: after.TotalAlloc - before.TotalAlloc}
	if err := json.NewEncoder(os.Stdout).Encode(report); err != nil {
		return fail(err)
	}
	return 0
}

// BenchmarkDrainMemory drains drainRows pending calls with one dispatcher
// process at Concurrency 256 and its other settings at their defaults, a
// no-op provider, and reports the process's peak resident set
// (peak-RSS-MiB, from the kernel's accounting of the child) and its Go
// allocations per call (allocs/call, B/call) over the drain. A process of
// its own, so that the figure is the dispatcher's and not the test
// binary's; memory is reported, never asserted.
func BenchmarkDrainMemory(b *testing.B) {
	var rss, allocs, bytes float64
	for i := range b.N {
		b.StopTimer()
		schema := pgoncetest.Schema(b)
		benchFill(b, schema, fmt.Sprintf("memory/%d", i), benchTool, drainRows)
		benchAnalyze(b, schema)
		b.StartTimer()

		cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^$") //nolint:gosec // the test binary itself
		cmd.Env = append(os.Environ(), memoryChildSchemaEnv+"="+schema, childURLEnv+"="+pgoncetest.DatabaseURL(b),
			memoryChildConcurrencyEnv+"="+strconv.Itoa(memoryConcurrency))
		cmd.Stderr = os.Stderr
		stdout, err := cmd.StdoutPipe()
		require.NoError(b, err)
		require.NoError(b, cmd.Start())
		benchAwaitEmpty(b, schema)
		require.NoError(b, cmd.Process.Signal(syscall.SIGTERM))
		var report memoryReport
		require.NoError(b, json.NewDecoder(stdout).Decode(&report))
		require.NoError(b, cmd.Wait())
		require.Equal(b, int64(drainRows), report.Calls, "the child must have made every call, once")

		usage, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage)
		require.True(b, ok, "no resource usage for the child")
		rss = max(rss, float64(usage.Maxrss)/1024) // Maxrss is in KiB on Linux
		allocs += float64(report.Allocs) / float64(report.Calls)
		bytes += float64(report.Bytes) / float64(report.Calls)
	}
	b.ReportMetric(rss, "peak-RSS-MiB")
	b.ReportMetric(allocs/float64(b.N), "allocs/call")
	b.ReportMetric(bytes/float64(b.N), "B/call")
}
