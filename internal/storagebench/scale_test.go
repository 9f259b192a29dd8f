package storagebench_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/migrations"
	"github.com/pgonce/pgonce/outbox"
)

const (
	// scaleKeysEnv selects how many finished keys the large table holds.
	scaleKeysEnv     = "PGONCE_BENCH_SCALE_KEYS"
	scaleKeysDefault = 10_000_000

	// scaleBaselineKeys is the small table every figure is compared with.
	scaleBaselineKeys = 10_000

	// scaleRepsEnv selects how many times each sub-benchmark runs.
	scaleRepsEnv     = "PGONCE_BENCH_SCALE_REPS"
	scaleRepsDefault = 5

	// templateKeys is how many keys are finished through the public API
	// and then replicated.
	templateKeys = 1000

	// replicateChunkRows is about how many rows one replicating statement
	// inserts.
	replicateChunkRows = 500_000

	// claimRowsEnv selects the backlog of pending calls one claim
	// iteration drains (default claimRowsDefault); pruneRows is the keys
	// one prune iteration expires and forgets.
	claimRowsEnv     = "PGONCE_BENCH_SCALE_CLAIM_ROWS"
	claimRowsDefault = 10_000
	pruneRows        = 10_000

	// sampleKeys is how many random existing keys the Get benchmark reads.
	sampleKeys = 100_000

	// benchRetention is the retention and tombstone horizon of the keys the
	// benchmarks add, so that pruning with a clock benchRetireAhead ahead
	// removes them and leaves the fixture's own keys, kept for 30 days, as
	// they were.
	benchRetention   = time.Minute
	benchRetireAhead = time.Hour

	// Target of issue 11: submit and claim at 10^7 keys cost at most this
	// many times what they cost at 10^4.
	scaleTargetRatio = 1.15
)

// scaleFixture is a key table of finished keys, shared by every repetition
// of BenchmarkScale in the process.
type scaleFixture struct {
	keys   int64
	schema string
	// client adds the keys that prune removes, on the database's clock.
	client *outbox.Client[pgx.Tx]
	// pruner prunes with its clock ahead by ahead.
	pruner *outbox.Client[pgx.Tx]
	ahead  atomic.Int64
	sample []outbox.Key
	size   tableSize

	build, replicate, vacuum time.Duration
}

// scaleMetric is one figure BenchmarkScale measures at both scales.
type scaleMetric struct {
	name string
	unit string
	// cost reports whether the figure is a cost (more is worse) rather
	// than a throughput.
	cost bool
	// run measures the figure on small and on large, in turns, and
	// returns it for each.
	run func(b *testing.B, small, large *scaleFixture) (float64, float64)
}

var scaleMetrics = []scaleMetric{
	{name: "SubmitTx", unit: "ns/op", cost: true, run: benchSubmitTx},
	{name: "Claim", unit: "ns/row", cost: true, run: benchClaim},
	{name: "Get", unit: "ns/op", cost: true, run: benchGet},
	{name: "Prune", unit: "keys/s", run: benchPrune},
}

// scalePair is what one run of a sub-benchmark measured at both scales.
type scalePair struct{ small, large float64 }

// scale holds the fixtures and what every repetition measured.
var scale struct {
	once         sync.Once
	ready        bool
	small, large *scaleFixture
	schemas      []string // every schema created, to drop at the end

	mu sync.Mutex
	// results[metric][b] is the pair measured by the last run of b, the
	// one the framework reports: a sub-benchmark calls its function with a
	// growing b.N, and -count repeats it with a new b each time.
	results map[string]map[*testing.B]scalePair
}

// BenchmarkScale compares, on a key table of PGONCE_BENCH_SCALE_KEYS
// finished keys (default 10 million) and one of 10 thousand, the cost of a
// SubmitTx (a transaction with one submit), of a claim per row (a
// dispatcher draining 10,000 pending calls), of a Get of a random existing
// key, and the throughput of pruning (expiring, then forgetting, 10,000
// keys). Each table is built once per process: a thousand refund calls
// finished through the public API, replicated inside PostgreSQL, then
// VACUUM (ANALYZE). Every key a benchmark adds is pruned again, so the
// tables keep their size.
//
// The machine is shared, and its load changes faster than a repetition
// lasts, so the two scales are measured in turns within each sub-benchmark:
// one submit (or get, or drain, or prune) on one table, then the same on the
// other, the order alternating, and each sub-benchmark reports both figures
// and their ratio. Per-operation figures are the median of every operation's
// time; drains and prunes are timed whole. Each sub-benchmark runs
// PGONCE_BENCH_SCALE_REPS times (default 5, Metric/Rep=R; benchstat -ignore
// /Rep groups them). When the process ends it prints the medians, the median
// of the paired ratios and the tables' sizes, and drops the tables (make
// bench-scale).
func BenchmarkScale(b *testing.B) {
	scale.once.Do(func() {
		large := int64(envInt(b, scaleKeysEnv, scaleKeysDefault))
		if large <= scaleBaselineKeys {
			b.Fatalf("%s=%d: want more than the %d keys of the baseline", scaleKeysEnv, large, scaleBaselineKeys)
		}
		scale.small = buildScaleFixture(b, scaleBaselineKeys)
		scale.large = buildScaleFixture(b, large)
		scale.ready = true
	})
	if !scale.ready {
		b.Fatal("the scale fixtures could not be built")
	}
	reps := envInt(b, scaleRepsEnv, scaleRepsDefault)
	for rep := 1; rep <= reps; rep++ {
		for _, metric := range scaleMetrics {
			b.Run(fmt.Sprintf("%s/Rep=%d", metric.name, rep), func(b *testing.B) {
				small, large := metric.run(b, scale.small, scale.large)
				b.ReportMetric(small, fmt.Sprintf("%s@%dkeys", metric.unit, scale.small.keys))
				b.ReportMetric(large, fmt.Sprintf("%s@%dkeys", metric.unit, scale.large.keys))
				if small > 0 {
					b.ReportMetric(large/small, "ratio")
				}
				recordScaleResult(b, metric.name, scalePair{small: small, large: large})
			})
		}
	}
}

func recordScaleResult(b *testing.B, metric string, pair scalePair) {
	scale.mu.Lock()
	defer scale.mu.Unlock()
	if scale.results == nil {
		scale.results = map[string]map[*testing.B]scalePair{}
	}
	if scale.results[metric] == nil {
		scale.results[metric] = map[*testing.B]scalePair{}
	}
	scale.results[metric][b] = pair
}

// inTurns returns the fixtures in the order of turn i: small first on even
// turns, large first on odd ones.
func inTurns(i int, small, large *scaleFixture) [2]*scaleFixture {
	if i%2 == 0 {
		return [2]*scaleFixture{small, large}
	}
	return [2]*scaleFixture{large, small}
}

// buildScaleFixture builds a schema whose key table holds keys finished
// keys (rounded up to a multiple of templateKeys).
func buildScaleFixture(b *testing.B, keys int64) *scaleFixture {
	b.Helper()
	ctx := context.Background()
	began := time.Now()
	f := &scaleFixture{schema: pgoncetest.NewSchemaName(b)}
	scale.schemas = append(scale.schemas, f.schema)
	fmt.Fprintf(os.Stderr, "scale: building %d finished keys in schema %s (dropped at the end; by hand if the process dies)\n", keys, f.schema)
	require.NoError(b, migrations.Up(ctx, pgoncetest.DB(b), f.schema))

	// The templates: real calls, finished by a dispatcher under the
	// default retention.
	templater, err := outbox.NewPgx(pgoncetest.Pool(b), outbox.Config{Schema: f.schema, Registry: refundRegistry(b)})
	require.NoError(b, err)
	templates := submitBulk(b, templater, pgoncetest.Pool(b), templateKeys)
	drain(b, templater, f.schema, templateKeys)

	statement := replicaStatements(b, f.schema)
	copyTemplates(b, f.schema)
	copies := (keys+templateKeys-1)/templateKeys - 1
	perChunk := max(1, int64(replicateChunkRows/templateKeys))
	replicated := time.Now()
	for first := int64(1); first <= copies; first += perChunk {
		last := min(first+perChunk-1, copies)
		require.Equal(b, (last-first+1)*templateKeys, replicate(b, statement, f.schema, first, last))
		if copies > perChunk {
			fmt.Fprintf(os.Stderr, "scale: %d of %d keys after %s\n",
				(last+1)*templateKeys, (copies+1)*templateKeys, time.Since(began).Round(time.Second))
		}
	}
	f.replicate = time.Since(replicated)
	f.keys = (copies + 1) * templateKeys
	if copies > 0 {
		for _, key := range sampleReplicaKeys(b, statement, f.schema, templateKeys, copies, sampleKeys) {
			f.sample = append(f.sample, outbox.Key(key))
		}
	} else {
		f.sample = templates
	}
	dropTemplates(b, f.schema)

	vacuumed := time.Now()
	_, err = pgoncetest.Pool(b).Exec(ctx, `VACUUM (ANALYZE) `+ident.Quote(f.schema)+"."+ident.Quote(keyTable))
	require.NoError(b, err)
	f.vacuum = time.Since(vacuumed)
	f.build = time.Since(began)
	f.size = measureTable(b, f.schema)
	require.Equal(b, f.keys, f.size.Rows)

	// A replica reads like the real key it was copied from.
	res, err := templater.Get(ctx, f.sample[0])
	require.NoError(b, err)
	require.Equal(b, outbox.StateSucceeded, res.State)
	require.Equal(b, refundTool, res.Tool)
	require.Equal(b, 1, res.Attempts)
	require.Len(b, res.Response, refundResponseBytes)
	require.False(b, res.CompletedAt.IsZero())

	config := outbox.Config{
		Schema:             f.schema,
		Registry:           refundRegistry(b),
		Retention:          benchRetention,
		TombstoneRetention: benchRetention,
	}
	f.client, err = outbox.NewPgx(pgoncetest.Pool(b), config)
	require.NoError(b, err)
	config.NowFunc = func() time.Time { return time.Now().Add(time.Duration(f.ahead.Load())) }
	f.pruner, err = outbox.NewPgx(pgoncetest.Pool(b), config)
	require.NoError(b, err)
	fmt.Fprintf(os.Stderr, "scale: %d keys built in %s (replicated in %s, vacuumed in %s), %.1f bytes per key\n",
		f.keys, f.build.Round(time.Millisecond), f.replicate.Round(time.Millisecond), f.vacuum.Round(time.Millisecond),
		perKey(f.size.Total(), f.keys))
	return f
}

// prune expires, then forgets, the count finished keys that f.client added,
// and fails b unless it did exactly that: the fixture's own keys stay. The
// first Prune runs with the pruner's clock past their retention; it may
// already forget some of the tombstones it made, as its clock moves on
// between statements. The second runs past their tombstones' horizon.
func (f *scaleFixture) prune(b *testing.B, count int) {
	b.Helper()
	ctx := context.Background()
	f.ahead.Store(int64(benchRetireAhead))
	first, err := f.pruner.Prune(ctx, nil)
	require.NoError(b, err)
	f.ahead.Store(int64(benchRetireAhead + 2*benchRetention))
	second, err := f.pruner.Prune(ctx, nil)
	require.NoError(b, err)
	require.Equal(b, outbox.PruneResult{Keys: int64(count), Tombstones: int64(count)},
		outbox.PruneResult{Keys: first.Keys + second.Keys, Tombstones: first.Tombstones + second.Tombstones},
		"pruning must expire and forget the benchmark's keys, and nothing else")
	require.Zero(b, second.Keys, "every key must expire in the first Prune")
}

// fill submits count pending refund calls through f.client in bulk.
func (f *scaleFixture) fill(b *testing.B, count int) {
	b.Helper()
	submitBulk(b, f.client, pgoncetest.Pool(b), count)
}

// benchSubmitTx times a transaction that submits one call and commits, on
// each table in turn, and returns the median time of each.
func benchSubmitTx(b *testing.B, small, large *scaleFixture) (float64, float64) {
	ctx := context.Background()
	pool := pgoncetest.Pool(b)
	times := map[*scaleFixture][]time.Duration{}
	b.ResetTimer()
	for i := range b.N {
		for _, f := range inTurns(i, small, large) {
			began := time.Now()
			tx, err := pool.Begin(ctx)
			require.NoError(b, err)
			if _, err := f.client.SubmitTx(ctx, tx, refundCall(callNumbers.Add(1))); err != nil {
				_ = tx.Rollback(ctx)
				require.NoError(b, err)
			}
			require.NoError(b, tx.Commit(ctx))
			times[f] = append(times[f], time.Since(began))
		}
	}
	b.StopTimer()
	for _, f := range []*scaleFixture{small, large} {
		drain(b, f.client, f.schema, b.N)
		f.prune(b, b.N)
	}
	return medianNanoseconds(times[small]), medianNanoseconds(times[large])
}

// benchClaim times a dispatcher that drains a backlog of
// PGONCE_BENCH_SCALE_CLAIM_ROWS pending calls (default 10,000), from its
// start to the commit of the last outcome, on each table in turn, and
// returns the time per row of each. The backlog's size matters at 10^7
// keys: a claim and its outcome write into the leaves of the key and scope
// indexes that the backlog's submits read, and whether those leaves are
// still in shared_buffers when the claim comes depends on how many other
// leaves the backlog brought in since (docs/performance.md, "Scale").
func benchClaim(b *testing.B, small, large *scaleFixture) (float64, float64) {
	claimRows := envInt(b, claimRowsEnv, claimRowsDefault)
	elapsed := map[*scaleFixture]time.Duration{}
	for i := range b.N {
		b.StopTimer()
		small.fill(b, claimRows)
		large.fill(b, claimRows)
		b.StartTimer()
		for _, f := range inTurns(i, small, large) {
			elapsed[f] += drain(b, f.client, f.schema, claimRows)
		}
		b.StopTimer()
		small.prune(b, claimRows)
		large.prune(b, claimRows)
		b.StartTimer()
	}
	perRow := func(f *scaleFixture) float64 {
		return float64(elapsed[f].Nanoseconds()) / float64(b.N*claimRows)
	}
	return perRow(small), perRow(large)
}

// benchGet times a Get of a random existing key, on each table in turn,
// and returns the median time of each.
func benchGet(b *testing.B, small, large *scaleFixture) (float64, float64) {
	ctx := context.Background()
	times := map[*scaleFixture][]time.Duration{}
	b.ResetTimer()
	for i := range b.N {
		for _, f := range inTurns(i, small, large) {
			began := time.Now()
			res, err := f.client.Get(ctx, f.sample[i%len(f.sample)])
			times[f] = append(times[f], time.Since(began))
			require.NoError(b, err)
			if res.State != outbox.StateSucceeded {
				b.Fatalf("key %s is %s, want succeeded", res.Key, res.State)
			}
		}
	}
	b.StopTimer()
	return medianNanoseconds(times[small]), medianNanoseconds(times[large])
}

// benchPrune times the expiry, then the deletion, of pruneRows finished
// keys, on each table in turn, and returns the keys per second of each.
func benchPrune(b *testing.B, small, large *scaleFixture) (float64, float64) {
	elapsed := map[*scaleFixture]time.Duration{}
	for i := range b.N {
		b.StopTimer()
		for _, f := range []*scaleFixture{small, large} {
			f.fill(b, pruneRows)
			drain(b, f.client, f.schema, pruneRows)
		}
		b.StartTimer()
		for _, f := range inTurns(i, small, large) {
			began := time.Now()
			f.prune(b, pruneRows)
			elapsed[f] += time.Since(began)
		}
	}
	perSecond := func(f *scaleFixture) float64 {
		return float64(b.N*pruneRows) / elapsed[f].Seconds()
	}
	return perSecond(small), perSecond(large)
}

// medianNanoseconds returns the median of times, in nanoseconds.
func medianNanoseconds(times []time.Duration) float64 {
	values := make([]float64, len(times))
	for i, t := range times {
		values[i] = float64(t.Nanoseconds())
	}
	return median(values)
}

// scaleFinish prints what BenchmarkScale measured, if it ran, and drops its
// schemas.
func scaleFinish() {
	if len(scale.results) > 0 && scale.ready {
		printScale(os.Stdout)
	}
	if len(scale.schemas) == 0 {
		return
	}
	pool, _, err := pgoncetest.Shared()
	if err != nil {
		return
	}
	for _, schema := range scale.schemas {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+ident.Quote(schema)+" CASCADE"); err != nil {
			fmt.Fprintf(os.Stderr, "scale: drop schema %s: %v\n", schema, err)
		}
		cancel()
	}
}

// median returns the median of values, or 0 for none.
func median(values []float64) float64 {
	if len(values) == 0 {
		return 0
	}
	sorted := slices.Sorted(slices.Values(values))
	if n := len(sorted); n%2 == 0 {
		return (sorted[n/2-1] + sorted[n/2]) / 2
	}
	return sorted[len(sorted)/2]
}

// printScale writes the readable block of figures, then one line of JSON
// after "storagebench-scale: ".
func printScale(w io.Writer) {
	fixtures := []*scaleFixture{scale.small, scale.large}
	fmt.Fprintf(w, "\nstorage scale: %d and %d finished keys\n", scale.small.keys, scale.large.keys)
	fmt.Fprintf(w, "  tables (as built, after VACUUM (ANALYZE)):\n")
	sizes := map[string]any{}
	for _, f := range fixtures {
		fmt.Fprintf(w, "    %d keys, built in %s (replicated in %s, vacuumed in %s)\n",
			f.keys, f.build.Round(time.Millisecond), f.replicate.Round(time.Millisecond), f.vacuum.Round(time.Millisecond))
		fmt.Fprintf(w, "      %-32s %14d bytes %8.1f per key\n", "heap (incl. TOAST)", f.size.Heap+f.size.Toast, perKey(f.size.Heap+f.size.Toast, f.keys))
		indexes := map[string]int64{}
		for _, index := range f.size.Indexes {
			fmt.Fprintf(w, "      %-32s %14d bytes %8.1f per key\n", index.Name, index.Bytes, perKey(index.Bytes, f.keys))
			indexes[index.Name] = index.Bytes
		}
		fmt.Fprintf(w, "      %-32s %14d bytes %8.1f per key\n", "total", f.size.Total(), perKey(f.size.Total(), f.keys))
		sizes[fmt.Sprint(f.keys)] = map[string]any{
			"heap":          f.size.Heap + f.size.Toast,
			"indexes":       indexes,
			"total":         f.size.Total(),
			"build_seconds": f.build.Seconds(),
		}
	}

	type figure struct {
		Metric string             `json:"metric"`
		Unit   string             `json:"unit"`
		Median map[string]float64 `json:"median"`
		Ratio  float64            `json:"ratio"`
		Reps   int                `json:"reps"`
	}
	var figures []figure
	fmt.Fprintf(w, "  operations, medians of the repetitions (the ratio is the median of each repetition's %d-to-%d ratio):\n",
		scale.large.keys, scale.small.keys)
	fmt.Fprintf(w, "    %-10s %-8s %16s %16s %8s %5s\n", "operation", "unit",
		fmt.Sprintf("%d keys", scale.small.keys), fmt.Sprintf("%d keys", scale.large.keys), "ratio", "reps")
	for _, metric := range scaleMetrics {
		var small, large, ratios []float64
		for _, pair := range scale.results[metric.name] {
			small, large = append(small, pair.small), append(large, pair.large)
			if pair.small > 0 {
				ratios = append(ratios, pair.large/pair.small)
			}
		}
		fig := figure{
			Metric: metric.name,
			Unit:   metric.unit,
			Median: map[string]float64{fmt.Sprint(scale.small.keys): median(small), fmt.Sprint(scale.large.keys): median(large)},
			Ratio:  median(ratios),
			Reps:   len(small),
		}
		line := fmt.Sprintf("    %-10s %-8s %16.0f %16.0f %8.3f %5d", metric.name, metric.unit, median(small), median(large), fig.Ratio, fig.Reps)
		switch {
		case metric.cost && (metric.name == "SubmitTx" || metric.name == "Claim"):
			verdict := "met"
			if fig.Ratio > scaleTargetRatio {
				verdict = "NOT met"
			}
			line += fmt.Sprintf("   target <= %.2f: %s", scaleTargetRatio, verdict)
		case !metric.cost:
			line += "   (a throughput: below 1 is slower)"
		}
		fmt.Fprintln(w, line)
		figures = append(figures, fig)
	}
	line, _ := json.Marshal(map[string]any{"figures": figures, "sizes": sizes})
	fmt.Fprintf(w, "storagebench-scale: %s\n", line)
}
