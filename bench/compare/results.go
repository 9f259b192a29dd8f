package main

import (
	"encoding/csv"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The variants, by phase. The names are the CSV's and the printout's.
const (
	drainPgonceTuned   = "pgonce tuned"
	drainPgonceDefault = "pgonce defaults"
	// The tuned drain of a tool with flow control: limits that never bind
	// (a million in flight and a million a second), so that what it
	// measures is their cost, the controlled claim, against the tuned
	// drain of the same tool without them.
	drainPgonceLimited = "pgonce tuned with limits"
	drainRiverTuned    = "river tuned"

	// The tuned drains on database/sql, through pgx's stdlib driver:
	// pgonce's outbox.New over a *sql.DB, and river's riverdatabasesql,
	// which works jobs in poll-only mode (it has no listener without a
	// pgx pool beside it).
	drainPgonceTunedSQL = "pgonce tuned database/sql"
	drainRiverTunedSQL  = "river tuned database/sql"

	// The tuned drain in a fresh schema, its key table analyzed after the
	// fill or never, with the key's hash index or with the key as primary
	// key in its place.
	drainPgonceFreshAnalyzed   = "pgonce fresh analyzed"
	drainPgonceFreshUnanalyzed = "pgonce fresh unanalyzed"
	drainPgoncePkeyAnalyzed    = "pgonce primary key analyzed"
	drainPgoncePkeyUnanalyzed  = "pgonce primary key unanalyzed"
	drainRiverDefault          = "river defaults"
	// The fresh, never analyzed drain, dispatched on database/sql.
	drainPgonceFreshUnanalyzedSQL = "pgonce fresh unanalyzed database/sql"

	enqueueBarePgx   = "bare pgx"
	enqueueBareSQL   = "bare database/sql"
	enqueuePgoncePgx = "pgonce SubmitTx pgx"
	enqueuePgonceSQL = "pgonce SubmitTx database/sql"
	enqueueRiver     = "river InsertTx"
	// Transactions of callsPerManyTx calls each.
	enqueuePgonceEach  = "pgonce 10x SubmitTx pgx"
	enqueuePgonceMany  = "pgonce SubmitManyTx(10) pgx"
	enqueueRiverUnique = "river InsertTx unique"
	// river's unique InsertTx on database/sql, through riverdatabasesql.
	enqueueRiverUniqueSQL = "river InsertTx unique database/sql"
	// callsPerManyTx unique jobs in one InsertManyTx, on pgx.
	enqueueRiverManyUnique = "river InsertManyTx unique(10)"
	endToEndPgonce         = "pgonce"
	endToEndRiver          = "river"
	floorPgbench           = "pgbench model"
	unitCallsPerSecond     = "calls/s"
	unitTxPerSecond        = "tx/s"
	unitRowsPerSecond      = "rows/s"
	ratioPhase             = "ratio"
)

// allVariants are the names PGONCE_COMPARE_VARIANTS may give.
var allVariants = []string{
	drainPgonceTuned, drainPgonceDefault, drainPgonceLimited, drainRiverTuned, drainRiverDefault,
	drainPgonceFreshAnalyzed, drainPgonceFreshUnanalyzed, drainPgoncePkeyAnalyzed, drainPgoncePkeyUnanalyzed,
	drainPgonceTunedSQL, drainRiverTunedSQL, drainPgonceFreshUnanalyzedSQL,
	enqueueBarePgx, enqueueBareSQL, enqueuePgoncePgx, enqueuePgonceSQL, enqueueRiver, enqueueRiverUnique,
	enqueueRiverUniqueSQL, enqueuePgonceEach, enqueuePgonceMany, enqueueRiverManyUnique,
	endToEndPgonce, endToEndRiver, floorPgbench,
}

// result is one measurement.
type result struct {
	round   int
	phase   string
	variant string
	clients int
	count   int
	elapsed time.Duration
	// p50 and p99 are the commit-to-call latencies, end to end only.
	p50, p99   time.Duration
	hasLatency bool
	// walBytes is the WAL written during the measurement (0: not
	// measured, negative: unreadable), mallocs the process's heap
	// allocations.
	walBytes int64
	mallocs  uint64
	// serverCPU is the server's CPU time during the measurement on the
	// run's behalf, and serverCPUAll the whole server's, other clients'
	// included (0: not measured, negative: unreadable; see
	// [environment.readServerCPU]).
	serverCPU, serverCPUAll time.Duration
	// clientCPU is this process's CPU time during the measurement (0: not
	// measured, negative: unreadable).
	clientCPU time.Duration
}

// clientCPUPerCall is this process's CPU microseconds per call, job or
// transaction, or 0 when not measured.
func (r result) clientCPUPerCall() float64 { return perCall(r.clientCPU, r.count) }

// serverCPUPerCall is the server's CPU microseconds on the run's behalf
// per call, job or transaction, or 0 when not measured.
func (r result) serverCPUPerCall() float64 { return perCall(r.serverCPU, r.count) }

// serverCPUAllPerCall is the whole server's CPU microseconds per call,
// job, transaction or row, or 0 when not measured.
func (r result) serverCPUAllPerCall() float64 { return perCall(r.serverCPUAll, r.count) }

// perCall is d in microseconds per count, or 0 when d is not measured.
func perCall(d time.Duration, count int) float64 {
	if d <= 0 || count == 0 {
		return 0
	}
	return float64(d.Nanoseconds()) / 1e3 / float64(count)
}

// mallocsPerCall is the heap allocations per call, job or transaction, or
// 0 when not measured.
func (r result) mallocsPerCall() float64 {
	if r.count == 0 {
		return 0
	}
	return float64(r.mallocs) / float64(r.count)
}

// walPerCall is the WAL bytes written per call, job or transaction, or 0
// when not measured.
func (r result) walPerCall() float64 {
	if r.walBytes <= 0 || r.count == 0 {
		return 0
	}
	return float64(r.walBytes) / float64(r.count)
}

// rate is the measurement's throughput per second.
func (r result) rate() float64 { return float64(r.count) / r.elapsed.Seconds() }

func (r result) String() string {
	s := fmt.Sprintf("%-7s %-36s", r.phase, r.variant)
	switch r.phase {
	case phaseEnqueue:
		s += fmt.Sprintf(" %2d clients", r.clients)
	case phasePaced:
		s += fmt.Sprintf(" %5d/s", r.clients)
	}
	s += fmt.Sprintf(" %8d in %8s: %10.0f/s", r.count, r.elapsed.Round(time.Millisecond), r.rate())
	if w := r.walPerCall(); w > 0 {
		s += fmt.Sprintf(", %5.0f B of WAL each", w)
	}
	if m := r.mallocsPerCall(); m > 0 {
		s += fmt.Sprintf(", %4.0f allocs each", m)
	}
	if c := r.serverCPUPerCall(); c > 0 {
		s += fmt.Sprintf(", %6.1f µs server CPU each", c)
	}
	if c := r.serverCPUAllPerCall(); c > 0 {
		s += fmt.Sprintf(" (whole server %.1f µs)", c)
	}
	if c := r.clientCPUPerCall(); c > 0 {
		s += fmt.Sprintf(", %6.1f µs client CPU each", c)
	}
	if r.hasLatency {
		s += fmt.Sprintf(", commit to call p50 %s p99 %s", r.p50.Round(10*time.Microsecond), r.p99.Round(10*time.Microsecond))
	}
	return s
}

// resultSet is every measurement of the run.
type resultSet struct {
	all []result
}

func (rs *resultSet) add(results ...result) { rs.all = append(rs.all, results...) }

// find returns the measurement of round, or false.
func (rs *resultSet) find(round int, phase, variant string, clients int) (result, bool) {
	for _, r := range rs.all {
		if r.round == round && r.phase == phase && r.variant == variant && r.clients == clients {
			return r, true
		}
	}
	return result{}, false
}

// series is one variant across the rounds.
type series struct {
	phase, variant string
	clients        int
	unit           string
	rates          []float64
	p50s, p99s     []float64 // milliseconds
	// walEach is the WAL bytes per call, job or transaction, of each
	// round that measured it.
	walEach []float64
	// mallocsEach is the heap allocations per call, job or transaction.
	mallocsEach []float64
	// serverCPUEach is the server's CPU microseconds on the run's behalf
	// per call, job or transaction, and serverCPUAllEach the whole
	// server's.
	serverCPUEach, serverCPUAllEach []float64
	// clientCPUEach is this process's CPU microseconds per call, job or
	// transaction.
	clientCPUEach []float64
}

// summary is what the run measured, aggregated.
type summary struct {
	series []series
	ratios []ratio
}

func (rs *resultSet) summarize(s settings) summary {
	var sum summary
	seen := map[string]int{}
	for _, r := range rs.all {
		id := fmt.Sprintf("%s\x00%s\x00%d", r.phase, r.variant, r.clients)
		i, ok := seen[id]
		if !ok {
			i = len(sum.series)
			seen[id] = i
			sum.series = append(sum.series, series{phase: r.phase, variant: r.variant, clients: r.clients, unit: unitOf(r.phase)})
		}
		sum.series[i].rates = append(sum.series[i].rates, r.rate())
		if w := r.walPerCall(); w > 0 {
			sum.series[i].walEach = append(sum.series[i].walEach, w)
		}
		if m := r.mallocsPerCall(); m > 0 {
			sum.series[i].mallocsEach = append(sum.series[i].mallocsEach, m)
		}
		if c := r.serverCPUPerCall(); c > 0 {
			sum.series[i].serverCPUEach = append(sum.series[i].serverCPUEach, c)
		}
		if c := r.serverCPUAllPerCall(); c > 0 {
			sum.series[i].serverCPUAllEach = append(sum.series[i].serverCPUAllEach, c)
		}
		if c := r.clientCPUPerCall(); c > 0 {
			sum.series[i].clientCPUEach = append(sum.series[i].clientCPUEach, c)
		}
		if r.hasLatency {
			sum.series[i].p50s = append(sum.series[i].p50s, milliseconds(r.p50))
			sum.series[i].p99s = append(sum.series[i].p99s, milliseconds(r.p99))
		}
	}

	sum.ratios = rs.ratios(s)
	return sum
}

func unitOf(phase string) string {
	switch phase {
	case phaseEnqueue:
		return unitTxPerSecond
	case phaseFloor:
		return unitRowsPerSecond
	default:
		return unitCallsPerSecond
	}
}

// text renders the summary for the terminal.
func (sum summary) text(env *environment) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nmedians of %d rounds (min–max); rates per second\n", env.s.rounds)
	phase := ""
	for _, se := range sum.series {
		if se.phase != phase {
			phase = se.phase
			fmt.Fprintf(&b, "\n%s (%s)\n", phaseTitle(phase), se.unit)
		}
		label := se.variant
		switch se.phase {
		case phaseEnqueue:
			label = fmt.Sprintf("%s, %d clients", se.variant, se.clients)
		case phasePaced:
			label = fmt.Sprintf("%s, paced at %d/s", se.variant, se.clients)
		}
		lo, hi := slices.Min(se.rates), slices.Max(se.rates)
		fmt.Fprintf(&b, "  %-50s %10.0f   (%.0f–%.0f)", label, median(se.rates), lo, hi)
		if len(se.walEach) > 0 {
			fmt.Fprintf(&b, "   WAL %.0f B each", median(se.walEach))
		}
		if len(se.mallocsEach) > 0 {
			fmt.Fprintf(&b, ", %.0f allocs each", median(se.mallocsEach))
		}
		if len(se.serverCPUEach) > 0 {
			fmt.Fprintf(&b, ", server CPU %.1f µs each (%.1f–%.1f)", median(se.serverCPUEach), slices.Min(se.serverCPUEach), slices.Max(se.serverCPUEach))
		} else if len(se.serverCPUAllEach) > 0 {
			fmt.Fprintf(&b, ", whole server's CPU %.1f µs each (%.1f–%.1f)", median(se.serverCPUAllEach), slices.Min(se.serverCPUAllEach), slices.Max(se.serverCPUAllEach))
		}
		if len(se.clientCPUEach) > 0 {
			fmt.Fprintf(&b, ", client CPU %.1f µs each", median(se.clientCPUEach))
		}
		if len(se.p50s) > 0 {
			fmt.Fprintf(&b, "   commit to call p50 %.2f ms (%.2f–%.2f), p99 %.2f ms (%.2f–%.2f)",
				median(se.p50s), slices.Min(se.p50s), slices.Max(se.p50s),
				median(se.p99s), slices.Min(se.p99s), slices.Max(se.p99s))
		}
		b.WriteString("\n")
	}
	for _, group := range []struct {
		title string
		cpu   bool
	}{
		{title: "ratios (median of each round's ratio, min–max)"},
		{title: "server CPU per call, job or transaction, ratios (below 1: the first costs the server less)", cpu: true},
	} {
		header := false
		for _, q := range sum.ratios {
			if q.kind.serverCPU() != group.cpu {
				continue
			}
			if !header {
				fmt.Fprintf(&b, "\n%s\n", group.title)
				header = true
			}
			label := q.name
			if q.clients > 0 {
				label = fmt.Sprintf("%s, %d clients", q.name, q.clients)
			}
			fmt.Fprintf(&b, "  %-88s %6.2f×  (%.2f–%.2f)\n", label, median(q.values), slices.Min(q.values), slices.Max(q.values))
		}
	}
	return b.String()
}

func phaseTitle(phase string) string {
	switch phase {
	case phaseDrain:
		return "drain of a backlog, no-op provider and worker"
	case phaseEnqueue:
		return "caller transactions: a business row, and the library's insert beside it"
	case phaseEndToEnd:
		return "end to end: callers submit while one dispatcher or client runs the calls"
	case phasePaced:
		return "paced: callers submit at a steady rate while one dispatcher or client runs the calls"
	case phaseFloor:
		return "floor: pgbench over pgonce's claim and batch completion"
	}
	return phase
}

// writeCSV writes every measurement, then every round's ratios, to path.
func (rs *resultSet) writeCSV(path string, sum summary) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return fmt.Errorf("write CSV: %w", err)
	}
	file, err := os.Create(path) //nolint:gosec // the path is the operator's setting
	if err != nil {
		return fmt.Errorf("write CSV: %w", err)
	}
	w := csv.NewWriter(file)
	_ = w.Write([]string{"kind", "round", "phase", "variant", "clients", "count", "seconds", "per_second", "unit", "p50_ms", "p99_ms", "ratio", "wal_bytes_each", "allocs_each", "server_cpu_us_each", "server_all_cpu_us_each", "client_cpu_us_each"})
	for _, r := range rs.all {
		p50, p99 := "", ""
		if r.hasLatency {
			p50, p99 = formatFloat(milliseconds(r.p50), 3), formatFloat(milliseconds(r.p99), 3)
		}
		walEach, allocsEach, cpuEach, cpuAllEach, clientEach := "", "", "", "", ""
		if w := r.walPerCall(); w > 0 {
			walEach = formatFloat(w, 1)
		}
		if m := r.mallocsPerCall(); m > 0 {
			allocsEach = formatFloat(m, 1)
		}
		if c := r.serverCPUPerCall(); c > 0 {
			cpuEach = formatFloat(c, 2)
		}
		if c := r.serverCPUAllPerCall(); c > 0 {
			cpuAllEach = formatFloat(c, 2)
		}
		if c := r.clientCPUPerCall(); c > 0 {
			clientEach = formatFloat(c, 2)
		}
		_ = w.Write([]string{
			"run", strconv.Itoa(r.round + 1), r.phase, r.variant, strconv.Itoa(r.clients), strconv.Itoa(r.count),
			formatFloat(r.elapsed.Seconds(), 4), formatFloat(r.rate(), 1), unitOf(r.phase), p50, p99, "", walEach, allocsEach, cpuEach, cpuAllEach, clientEach,
		})
	}
	for _, q := range sum.ratios {
		for i, v := range q.values {
			_ = w.Write([]string{
				ratioPhase, strconv.Itoa(q.rounds[i] + 1), q.phase, q.name, strconv.Itoa(q.clients), "", "", "", "", "", "", formatFloat(v, 4), "", "", "", "", "",
			})
		}
	}
	w.Flush()
	if err := w.Error(); err != nil {
		_ = file.Close()
		return fmt.Errorf("write CSV: %w", err)
	}
	if err := file.Close(); err != nil {
		return fmt.Errorf("write CSV: %w", err)
	}
	return nil
}

// median returns the median of values, the mean of the middle two for an
// even count.
func median(values []float64) float64 {
	sorted := slices.Clone(values)
	slices.Sort(sorted)
	n := len(sorted)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

// quantile returns the q quantile of durations (nearest rank).
func quantile(durations []time.Duration, q float64) time.Duration {
	if len(durations) == 0 {
		return 0
	}
	sorted := slices.Clone(durations)
	slices.Sort(sorted)
	i := min(int(q*float64(len(sorted))), len(sorted)-1)
	return sorted[i]
}

func milliseconds(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

func formatFloat(v float64, digits int) string { return strconv.FormatFloat(v, 'f', digits, 64) }
