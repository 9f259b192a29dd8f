package faults_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/faults"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

// drainKeysEnv selects how many keys each drain of BenchmarkDrainProcesses
// submits before its dispatchers start.
const drainKeysEnv = "PGONCE_BENCH_DRAIN_KEYS"

// drainLimitEnv, when set, gives the drained tool flow control that does
// not bind: a limit of this many calls in flight and this many calls per
// second (burst as many), so that the drain measures what the controlled
// claim costs over the plain one.
const drainLimitEnv = "PGONCE_BENCH_DRAIN_LIMIT"

// BenchmarkDrainProcesses measures how fast 1, 2, 4 and 8 dispatcher
// processes (each with the campaign's dispatcher configuration) drain a
// backlog of keyed calls whose provider writes a ledger row: the scale note
// of docs/topologies.md. Run it with `make bench-drain`; with
// PGONCE_BENCH_DRAIN_LIMIT=N the drained tool has a limit of N in flight
// and N per second, which a drain does not reach when N is large.
func BenchmarkDrainProcesses(b *testing.B) {
	keys := 5000
	if n, err := strconv.Atoi(os.Getenv(drainKeysEnv)); err == nil && n > 0 {
		keys = n
	}
	for _, processes := range []int{1, 2, 4, 8} {
		b.Run(fmt.Sprintf("processes=%d", processes), func(b *testing.B) {
			var total time.Duration
			for range b.N {
				total += drainOnce(b, processes, keys)
			}
			b.ReportMetric(float64(keys)*float64(b.N)/total.Seconds(), "keys/s")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// drainOnce submits keys calls into a fresh schema, starts processes
// dispatcher processes and returns how long they took to finish them all.
func drainOnce(b *testing.B, processes, keys int) time.Duration {
	b.Helper()
	b.StopTimer()
	ctx := b.Context()
	schema := pgoncetest.Schema(b)
	pool := pgoncetest.Pool(b)
	require.NoError(b, faults.CreateLedger(ctx, pool, schema))
	registry, err := faults.NewLedger(pool, schema).Registry(nil)
	require.NoError(b, err)
	client, err := outbox.NewPgx(pool, outbox.Config{Schema: schema, Registry: registry, NotifyDisabled: true})
	require.NoError(b, err)
	if n, err := strconv.Atoi(os.Getenv(drainLimitEnv)); err == nil && n > 0 {
		_, err := client.SetToolLimits(ctx, faults.ToolKeyed, outbox.ToolLimits{MaxInFlight: n, Rate: float64(n), Burst: n},
			outbox.LimitParams{By: "bench", Reason: "a limit that does not bind"})
		require.NoError(b, err)
	}
	submitted := make([]outbox.Key, 0, keys)
	for start := 0; start < keys; start += 1000 {
		require.NoError(b, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for step := start; step < min(start+1000, keys); step++ {
				res, err := client.SubmitTx(ctx, tx, outbox.Call{RunID: "drain", Step: int64(step), Tool: faults.ToolKeyed, Args: map[string]any{"n": step}})
				if err != nil {
					return err
				}
				submitted = append(submitted, res.Key)
			}
			return nil
		}))
	}

	b.StartTimer()
	begin := time.Now()
	children := make([]*exec.Cmd, processes)
	for i := range children {
		cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^$") //nolint:gosec // the test binary itself
		cmd.Env = append(os.Environ(),
			childSchemaEnv+"="+schema,
			childURLEnv+"="+pgoncetest.DatabaseURL(b),
			childAppEnv+"=faults_drain",
			childWorkerEnv+"=drain-"+strconv.Itoa(i),
			childLatencyEnv+"=0s")
		cmd.Stderr = &bytes.Buffer{}
		_, err := cmd.StdinPipe() // closed by Wait: the child then exits
		require.NoError(b, err)
		require.NoError(b, cmd.Start())
		children[i] = cmd
	}
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	open, err := faults.AwaitTerminal(waitCtx, pool, schema, submitted)
	elapsed := time.Since(begin)
	b.StopTimer()
	for _, cmd := range children {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	}
	require.NoError(b, err, "%d keys still open", open)
	return elapsed
}
