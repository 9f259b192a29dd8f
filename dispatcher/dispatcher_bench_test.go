package dispatcher_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/migrations"
	"github.com/pgonce/pgonce/outbox"
)

// The benchmarks run dispatchers against the test database with a no-op
// provider, so that they time the dispatcher's own work: claims, the
// hand-off to workers and the recording of outcomes. Queues are filled
// outside the timer with one INSERT … SELECT over generate_series that
// writes the rows KeyInsert would. Times are reported, never asserted; read
// medians of -count=3 or more with benchstat.

const (
	// benchTool is the one tool the benchmarks register.
	benchTool = "noop"

	// drainRows is how many pending rows one BenchmarkDrain iteration
	// drains: the queue size the project cares about.
	drainRows = 100_000

	// endToEndRows is how many calls one BenchmarkEndToEnd iteration
	// submits and runs, and endToEndCallers how many goroutines submit them.
	endToEndRows    = 20_000
	endToEndCallers = 16

	// claimRows is the batch one BenchmarkClaim iteration submits and
	// drains: one claim's worth.
	claimRows = 100

	// benchTimeout bounds every wait, so that a lost row fails the
	// benchmark instead of hanging it.
	benchTimeout = 5 * time.Minute
)

// benchProvider succeeds at once with {} and counts its calls.
type benchProvider struct {
	calls   atomic.Int64
	target  atomic.Int64
	reached chan struct{}
}

func newBenchProvider() *benchProvider {
	return &benchProvider{reached: make(chan struct{}, 1)}
}

func (p *benchProvider) Call(context.Context, outbox.Request) (json.RawMessage, error) {
	if p.calls.Add(1) == p.target.Load() {
		p.reached <- struct{}{}
	}
	return json.RawMessage(`{}`), nil
}

// expect arms the provider to signal once n more calls have happened. No
// call may be running when it is called.
func (p *benchProvider) expect(n int) <-chan struct{} {
	p.target.Store(p.calls.Load() + int64(n))
	return p.reached
}

// benchClient returns a client over schema that serves benchTool with
// provider.
func benchClient(b *testing.B, schema string, provider outbox.Provider) *outbox.Client[pgx.Tx] {
	b.Helper()
	return benchClientConfig(b, schema, provider, outbox.Config{})
}

// benchClientConfig is benchClient with the rest of config.
func benchClientConfig(b *testing.B, schema string, provider outbox.Provider, config outbox.Config) *outbox.Client[pgx.Tx] {
	b.Helper()
	registry := outbox.NewRegistry()
	require.NoError(b, registry.Register(benchTool, provider, outbox.IdempotentByKey))
	config.Schema, config.Registry = schema, registry
	client, err := outbox.NewPgx(pgoncetest.Pool(b), config)
	require.NoError(b, err)
	return client
}

// benchRun starts count dispatchers over client. stop cancels them and
// waits until every Run has returned; it is also registered as a cleanup.
func benchRun(b *testing.B, client *outbox.Client[pgx.Tx], config dispatcher.Config, count int) (stop func()) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, count)
	for range count {
		d, err := dispatcher.New(client, config)
		require.NoError(b, err)
		go func() { errs <- d.Run(ctx) }()
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			for range count {
				require.NoError(b, <-errs)
			}
		})
	}
	b.Cleanup(stop)
	return stop
}

// benchFill queues rows pending calls of benchTool in schema, with keys,
// scopes and steps derived from prefix, and returns their keys. The rows
// mirror what KeyInsert writes; no notification is sent.
func benchFill(b *testing.B, schema, prefix, tool string, rows int) []string {
	b.Helper()
	ctx := context.Background()
	quoted := ident.Quote(schema)
	dbRows, err := pgoncetest.Pool(b).Query(ctx, `INSERT INTO `+quoted+`.pgonce_key (
			key,
			scope,
			run_id,
			step,
			tool,
			args
		)
		SELECT
			sha256(convert_to($1::text || '/' || i, 'UTF8')),
			sha256(convert_to('scope/' || $1::text || '/' || i, 'UTF8')),
			$1::text,
			i,
			$2::text,
			'{}'::bytea
		FROM generate_series(1, $3::bigint) AS i
		RETURNING 'k1_' || encode(pgonce_key.key, 'hex')`, prefix, tool, rows)
	require.NoError(b, err)
	keys, err := pgx.CollectRows(dbRows, pgx.RowTo[string])
	require.NoError(b, err)
	require.Len(b, keys, rows)
	return keys
}

// benchFinished adds rows succeeded keys to schema, off the queue: the
// history that retention keeps for 30 days.
func benchFinished(b *testing.B, schema string, rows int) {
	b.Helper()
	_, err := pgoncetest.Pool(b).Exec(context.Background(), `INSERT INTO `+ident.Quote(schema)+`.pgonce_key (
		key,
		scope,
		run_id,
		step,
		tool,
		args,
		state,
		response,
		available_at,
		updated_at,
		completed_at,
		expires_at,
		forget_at
	)
	SELECT
		sha256(convert_to('finished/' || i, 'UTF8')),
		sha256(convert_to('scope/finished/' || i, 'UTF8')),
		'finished',
		i,
		$1::text,
		'{}'::bytea,
		'succeeded',
		'{}'::bytea,
		NULL,
		NULL,
		now(),
		now() + interval '30 days',
		now() + interval '365 days'
	FROM generate_series(1, $2::bigint) AS i`, benchTool, rows)
	require.NoError(b, err)
}

// benchAnalyze refreshes the planner's statistics of schema's tables, as
// autovacuum would on a long-lived queue.
func benchAnalyze(b *testing.B, schema string) {
	b.Helper()
	quoted := ident.Quote(schema)
	_, err := pgoncetest.Pool(b).Exec(context.Background(),
		`ANALYZE `+quoted+`.pgonce_key`)
	require.NoError(b, err)
}

// benchAwait waits for a signal on ch, and fails b after benchTimeout.
func benchAwait(b *testing.B, ch <-chan struct{}, what string) {
	b.Helper()
	select {
	case <-ch:
	case <-time.After(benchTimeout):
		b.Fatalf("timed out waiting for %s", what)
	}
}

// benchAwaitEmpty waits until schema holds no open key: every outcome
// is recorded.
func benchAwaitEmpty(b *testing.B, schema string) {
	b.Helper()
	// Two probes that each read a partial index (due keys, leased keys),
	// however many finished keys the table holds.
	table := ident.Quote(schema) + `.pgonce_key`
	query := `SELECT EXISTS (SELECT 1 FROM ` + table + ` WHERE state = 'open' AND lease_until IS NULL)
		OR EXISTS (SELECT 1 FROM ` + table + ` WHERE lease_until IS NOT NULL)`
	deadline := time.Now().Add(benchTimeout)
	for {
		var open bool
		require.NoError(b, pgoncetest.Pool(b).QueryRow(context.Background(), query).Scan(&open))
		if !open {
			return
		}
		if time.Now().After(deadline) {
			b.Fatal("timed out waiting for every key to finish")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// benchAwaitListening waits until a dispatcher listens on schema's work
// channel, so that a notification sent from now on wakes it.
func benchAwaitListening(b *testing.B, schema string) {
	b.Helper()
	listen := "LISTEN " + ident.Quote(ident.WorkChannel(schema))
	deadline := time.Now().Add(benchTimeout)
	for {
		var listening bool
		require.NoError(b, pgoncetest.Pool(b).QueryRow(context.Background(),
			`SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE query = $1 AND state = 'idle')`,
			listen).Scan(&listening))
		if listening {
			return
		}
		if time.Now().After(deadline) {
			b.Fatal("timed out waiting for the dispatcher to listen")
		}
		time.Sleep(time.Millisecond)
	}
}

// BenchmarkDrain drains a queue of drainRows pending rows with 1, 2 and 4
// dispatchers, started once the queue is full, and reports calls/s. An
// iteration ends when the provider has seen every row and every outcome is
// recorded.
func BenchmarkDrain(b *testing.B) {
	for _, dispatchers := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("Dispatchers=%d", dispatchers), func(b *testing.B) {
			schema := pgoncetest.Schema(b)
			provider := newBenchProvider()
			client := benchClient(b, schema, provider)
			// No-op calls are cheap: many slots and big batches make few,
			// large transactions, which is what bounds the drain.
			config := dispatcher.Config{
				Concurrency:  benchEnvInt("PGONCE_BENCH_CONCURRENCY", 512),
				BatchSize:    benchEnvInt("PGONCE_BENCH_BATCH", 512),
				PollInterval: 10 * time.Millisecond,
			}
			var elapsed time.Duration
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				benchFill(b, schema, fmt.Sprintf("drain/%d", i), benchTool, drainRows)
				benchAnalyze(b, schema)
				reached := provider.expect(drainRows)
				b.StartTimer()

				began := time.Now()
				stop := benchRun(b, client, config, dispatchers)
				benchAwait(b, reached, "the provider calls")
				benchAwaitEmpty(b, schema)
				elapsed += time.Since(began)

				b.StopTimer()
				stop()
				b.StartTimer()
			}
			b.ReportMetric(float64(b.N*drainRows)/elapsed.Seconds(), "calls/s")
		})
	}
}

// BenchmarkEndToEnd times the whole path under load: endToEndCallers
// goroutines submit endToEndRows calls, each in a pgx transaction of its
// own and as fast as they can, while one dispatcher runs them; an iteration
// ends when every outcome is recorded. It reports calls/s with a
// notification per submit (NotifyCooldown negative) and with the default
// 10 ms NotifyCooldown, and how long
// calls waited from their submit to their claim (median, 99th percentile
// and worst, by the database's clock).
func BenchmarkEndToEnd(b *testing.B) { benchEndToEnd(b, 0) }

// BenchmarkEndToEndPaced is BenchmarkEndToEnd with the callers' submits
// paced to PGONCE_BENCH_E2E_RATE calls per second in all (default 2,000),
// below what either variant can take: it compares the waits from submit to
// claim at the same load, where BenchmarkEndToEnd gives the variant that
// moves more calls more work.
func BenchmarkEndToEndPaced(b *testing.B) {
	benchEndToEnd(b, benchEnvInt("PGONCE_BENCH_E2E_RATE", 2000))
}

// benchEndToEnd runs the end-to-end benchmarks; rate, when positive, paces
// the submits to that many per second in all.
func benchEndToEnd(b *testing.B, rate int) {
	for _, tt := range []struct {
		name     string
		cooldown time.Duration
	}{
		{name: "EverySubmitNotifies", cooldown: -1},
		{name: "NotifyCooldown=10ms"},
	} {
		b.Run(tt.name, func(b *testing.B) {
			schema := pgoncetest.Schema(b)
			provider := newBenchProvider()
			client := benchClientConfig(b, schema, provider, outbox.Config{NotifyCooldown: tt.cooldown})
			stop := benchRun(b, client, dispatcher.Config{
				Concurrency:  benchEnvInt("PGONCE_BENCH_CONCURRENCY", 512),
				BatchSize:    benchEnvInt("PGONCE_BENCH_BATCH", 512),
				PollInterval: time.Second,
			}, 1)
			defer stop()
			benchAwaitListening(b, schema)

			ctx := context.Background()
			pool := pgoncetest.Pool(b)
			var (
				elapsed                   time.Duration
				waitP50, waitP99, waitMax []float64
			)
			b.ResetTimer()
			for i := range b.N {
				reached := provider.expect(endToEndRows)
				began := time.Now()
				var (
					next    atomic.Int64
					callers sync.WaitGroup
				)
				for range endToEndCallers {
					callers.Go(func() {
						for n := next.Add(1); n <= endToEndRows; n = next.Add(1) {
							if rate > 0 {
								// Call n is due n/rate seconds after the start.
								time.Sleep(time.Until(began.Add(time.Duration(n) * time.Second / time.Duration(rate))))
							}
							tx, err := pool.Begin(ctx)
							if err != nil {
								b.Error(err)
								return
							}
							_, err = client.SubmitTx(ctx, tx, outbox.Call{
								RunID: fmt.Sprintf("e2e/%d", i), Step: n, Tool: benchTool, Args: map[string]any{},
							})
							if err == nil {
								err = tx.Commit(ctx)
							}
							if err != nil {
								_ = tx.Rollback(ctx)
								b.Error(err)
								return
							}
						}
					})
				}
				callers.Wait()
				if b.Failed() {
					b.FailNow()
				}
				benchAwait(b, reached, "the provider calls")
				benchAwaitEmpty(b, schema)
				elapsed += time.Since(began)
				b.StopTimer()
				// How long each call waited for its claim, from its submit
				// (the submitting transaction's start), by the database's
				// clock.
				var p50, p99, worst float64
				require.NoError(b, pool.QueryRow(ctx, `SELECT
						percentile_cont(0.5) WITHIN GROUP (ORDER BY w),
						percentile_cont(0.99) WITHIN GROUP (ORDER BY w),
						max(w)
					FROM (
						SELECT extract(epoch FROM first_attempted_at - created_at) * 1000 AS w
						FROM `+ident.Quote(schema)+`.pgonce_key
						WHERE run_id = $1
					) AS waits`, fmt.Sprintf("e2e/%d", i)).Scan(&p50, &p99, &worst))
				waitP50, waitP99, waitMax = append(waitP50, p50), append(waitP99, p99), append(waitMax, worst)
				b.StartTimer()
			}
			b.ReportMetric(float64(b.N*endToEndRows)/elapsed.Seconds(), "calls/s")
			b.ReportMetric(median(waitP50), "submit-to-claim-p50-ms")
			b.ReportMetric(median(waitP99), "submit-to-claim-p99-ms")
			b.ReportMetric(median(waitMax), "submit-to-claim-max-ms")
		})
	}
}

// BenchmarkClaim times the dispatch of one batch of claimRows rows, from
// the notification that wakes a waiting dispatcher to the commit of the
// last outcome, while the key table also holds 10 thousand or 1 million
// finished keys, or 100 thousand due keys of a tool no dispatcher serves.
// Claims read only the served tool's part of the partial index of due keys,
// whose size does not change, so ns/row should not either. Each fixture is
// built once per process and shared by every -count; the batch's keys are
// deleted after each iteration, so that the key table keeps its size.
func BenchmarkClaim(b *testing.B) {
	parent := b
	for _, tt := range []struct {
		name     string
		finished int
		unserved int
	}{
		{name: "Finished=10k", finished: 10_000},
		{name: "Finished=1M", finished: 1_000_000},
		{name: "Finished=10k/Unserved=100k", finished: 10_000, unserved: 100_000},
	} {
		var (
			once   sync.Once
			schema string
			runs   atomic.Int64
		)
		b.Run(tt.name, func(b *testing.B) {
			once.Do(func() {
				name := pgoncetest.NewSchemaName(b)
				parent.Cleanup(func() { pgoncetest.DropSchema(parent, name) })
				ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
				defer cancel()
				require.NoError(b, migrations.Up(ctx, pgoncetest.DB(b), name))
				benchFinished(b, name, tt.finished)
				if tt.unserved > 0 {
					benchFill(b, name, "unserved", "unserved", tt.unserved)
				}
				benchAnalyze(b, name)
				schema = name
			})
			if schema == "" {
				b.Fatal("the fixture of finished keys could not be built")
			}
			provider := newBenchProvider()
			client := benchClient(b, schema, provider)
			// One claim takes the whole batch; only a notification wakes
			// the dispatcher.
			config := dispatcher.Config{
				Concurrency:  claimRows,
				BatchSize:    claimRows,
				PollInterval: time.Hour,
			}
			stop := benchRun(b, client, config, 1)
			defer stop()
			benchAwaitListening(b, schema)
			done := benchListenDone(b, schema)

			ctx := context.Background()
			quoted := ident.Quote(schema)
			run := runs.Add(1)
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				keys := benchFill(b, schema, fmt.Sprintf("claim/%d/%d", run, i), benchTool, claimRows)
				reached := provider.expect(claimRows)
				b.StartTimer()

				_, err := pgoncetest.Pool(b).Exec(ctx, `SELECT pg_notify($1, '')`, ident.WorkChannel(schema))
				require.NoError(b, err)
				benchAwait(b, reached, "the provider calls")
				done.await(b, claimRows)

				b.StopTimer()
				_, err = pgoncetest.Pool(b).Exec(ctx, `DELETE FROM `+quoted+`.pgonce_key
					WHERE key IN (SELECT decode(substr(k, 4), 'hex') FROM unnest($1::text[]) AS k)`, keys)
				require.NoError(b, err)
				b.StartTimer()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*claimRows), "ns/row")
		})
	}
}

// benchDone counts the keys notified on schema's done channel: each
// notification carries the comma-separated keys whose outcomes committed.
type benchDone struct {
	notifications chan struct{}
}

// benchListenDone listens on schema's done channel until b ends.
func benchListenDone(b *testing.B, schema string) *benchDone {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := pgoncetest.Pool(b).Acquire(ctx)
	require.NoError(b, err)
	_, err = conn.Exec(ctx, "LISTEN "+ident.Quote(ident.DoneChannel(schema)))
	if err != nil {
		conn.Release()
		cancel()
		require.NoError(b, err)
	}
	done := &benchDone{notifications: make(chan struct{}, 1024)}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			notification, err := conn.Conn().WaitForNotification(ctx)
			if err != nil {
				return
			}
			for range strings.SplitSeq(notification.Payload, ",") {
				done.notifications <- struct{}{}
			}
		}
	}()
	b.Cleanup(func() {
		cancel()
		<-stopped
		// A cancelled wait closes the connection, so it never returns to
		// the pool listening.
		conn.Release()
	})
	return done
}

// await waits for n keys to be notified.
func (d *benchDone) await(b *testing.B, n int) {
	b.Helper()
	timeout := time.After(benchTimeout)
	for range n {
		select {
		case <-d.notifications:
		case <-timeout:
			b.Fatal("timed out waiting for outcomes to be recorded")
		}
	}
}

// BenchmarkLatency times, with notifications on, the delay from the commit
// of a submitted call to its provider call. The dispatcher polls once an
// hour, so only the notification wakes it. It reports the median and the
// 99th percentile in milliseconds.
func BenchmarkLatency(b *testing.B) {
	schema := pgoncetest.Schema(b)
	called := make(chan time.Time, 1)
	provider := outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
		called <- time.Now()
		return json.RawMessage(`{}`), nil
	})
	client := benchClient(b, schema, provider)
	stop := benchRun(b, client, dispatcher.Config{PollInterval: time.Hour}, 1)
	defer stop()
	benchAwaitListening(b, schema)

	ctx := context.Background()
	latencies := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		_, err := client.Submit(ctx, outbox.Call{RunID: "latency", Step: int64(i), Tool: benchTool, Args: map[string]any{}})
		require.NoError(b, err)
		committed := time.Now()
		select {
		case calledAt := <-called:
			latencies = append(latencies, calledAt.Sub(committed))
		case <-time.After(benchTimeout):
			b.Fatal("timed out waiting for the provider call")
		}
	}
	b.StopTimer()
	slices.Sort(latencies)
	b.ReportMetric(benchQuantile(latencies, 0.50), "p50-ms")
	b.ReportMetric(benchQuantile(latencies, 0.99), "p99-ms")
}

// benchQuantile returns the q quantile of sorted, in milliseconds.
func benchQuantile(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := min(int(q*float64(len(sorted))), len(sorted)-1)
	return float64(sorted[i].Nanoseconds()) / 1e6
}

// benchEnvInt reads a tuning knob of the drain benchmark from the
// environment (PGONCE_BENCH_CONCURRENCY, PGONCE_BENCH_BATCH), so that other
// settings can be compared without editing the benchmark.
func benchEnvInt(name string, fallback int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return fallback
}

// median returns the median of values, or 0 for none.
func median(values []float64) float64 {
	if len(values) == 0 {
		return 0
	}
	sorted := slices.Clone(values)
	slices.Sort(sorted)
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}
