package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestMedian(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		name   string
		values []float64
		want   float64
	}{
		{name: "OddCountTakesTheMiddle", values: []float64{9, 1, 5}, want: 5},
		{name: "EvenCountAveragesTheMiddleTwo", values: []float64{4, 1, 3, 2}, want: 2.5},
		{name: "None", values: nil, want: 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.InDelta(t, tt.want, median(tt.values), 1e-9)
		})
	}
}

func TestQuantile(t *testing.T) {
	t.Parallel()

	durations := make([]time.Duration, 0, 100)
	for i := 100; i >= 1; i-- {
		durations = append(durations, time.Duration(i)*time.Millisecond)
	}
	require.Equal(t, 51*time.Millisecond, quantile(durations, 0.50))
	require.Equal(t, 100*time.Millisecond, quantile(durations, 0.99))
	require.Equal(t, time.Duration(100), durations[0]/time.Millisecond, "quantile must not sort its argument in place")
}

// TestSummarizeRatios checks that every ratio is taken round by round,
// that a cost ratio is the inverse of the rates', and that a ratio skips a
// round one of its sides did not run in.
func TestSummarizeRatios(t *testing.T) {
	t.Parallel()

	s := settings{rounds: 3, enqueueClients: []int{8}}
	rs := &resultSet{}
	perSecond := func(round int, phase, variant string, clients int, rate float64) result {
		return result{round: round, phase: phase, variant: variant, clients: clients, count: int(rate), elapsed: time.Second}
	}
	// Round 0 and 1: river tuned at 1000/s, pgonce tuned at 1500/s, then
	// 800/s; round 2 has no river figure.
	rs.add(
		perSecond(0, phaseDrain, drainPgonceTuned, 0, 1500),
		perSecond(0, phaseDrain, drainRiverTuned, 0, 1000),
		perSecond(1, phaseDrain, drainPgonceTuned, 0, 800),
		perSecond(1, phaseDrain, drainRiverTuned, 0, 1000),
		perSecond(2, phaseDrain, drainPgonceTuned, 0, 2000),
		perSecond(1, phaseDrain, drainPgonceLimited, 0, 720),
		perSecond(0, phaseEnqueue, enqueueBarePgx, 8, 2000),
		perSecond(0, phaseEnqueue, enqueuePgoncePgx, 8, 1000),
		perSecond(0, phaseFloor, floorPgbench, 0, 3000),
	)
	sum := rs.summarize(s)

	ratios := map[string]ratio{}
	for _, q := range sum.ratios {
		ratios[q.name] = q
	}
	drain := ratios["drain tuned: pgonce ÷ river"]
	require.Equal(t, []int{0, 1}, drain.rounds)
	require.InDeltaSlice(t, []float64{1.5, 0.8}, drain.values, 1e-9)

	limited := ratios["drain: limits set ÷ no limits, pgonce tuned"]
	require.Equal(t, []int{1}, limited.rounds)
	require.InDeltaSlice(t, []float64{0.9}, limited.values, 1e-9)

	cost := ratios["tx cost: SubmitTx pgx ÷ bare pgx"]
	require.Equal(t, 8, cost.clients)
	require.InDeltaSlice(t, []float64{2}, cost.values, 1e-9, "half the rate is twice the cost")

	floor := ratios["floor: pgonce tuned drain ÷ pgbench model"]
	require.InDeltaSlice(t, []float64{0.5}, floor.values, 1e-9)

	require.NotContains(t, ratios, "drain defaults: pgonce ÷ river", "a ratio with no round on both sides is left out")

	var pgonceTuned series
	for _, se := range sum.series {
		if se.variant == drainPgonceTuned {
			pgonceTuned = se
		}
	}
	require.InDeltaSlice(t, []float64{1500, 800, 2000}, pgonceTuned.rates, 1e-9)
}

func TestLatencyLog(t *testing.T) {
	t.Parallel()

	t.Run("EveryCallMeasured", func(t *testing.T) {
		t.Parallel()
		log := newLatencyLog(2)
		for n := range int64(2) {
			log.committed(n)
			log.called(n)
		}
		latencies, err := log.latencies()
		require.NoError(t, err)
		require.Len(t, latencies, 2)
	})

	t.Run("MissingCallIsAnError", func(t *testing.T) {
		t.Parallel()
		log := newLatencyLog(2)
		log.committed(0)
		log.called(0)
		log.committed(1)
		_, err := log.latencies()
		require.ErrorContains(t, err, "call 1")
	})
}

// TestServerCPURatios checks that a server CPU ratio divides the CPU per
// call, not the rates, skips a round either side lacks the figure of, and
// that the printout groups it apart.
func TestServerCPURatios(t *testing.T) {
	t.Parallel()

	s := settings{rounds: 2, enqueueClients: []int{1}}
	rs := &resultSet{}
	rs.add(
		// Round 0: SubmitManyTx(10) 100 tx in 1 s at 50 ms of server CPU
		// (500 µs a tx); river 50 tx in 1 s at 40 ms (800 µs a tx).
		result{round: 0, phase: phaseEnqueue, variant: enqueuePgonceMany, clients: 1, count: 100, elapsed: time.Second, serverCPU: 50 * time.Millisecond},
		result{round: 0, phase: phaseEnqueue, variant: enqueueRiverManyUnique, clients: 1, count: 50, elapsed: time.Second, serverCPU: 40 * time.Millisecond},
		// Round 1: river's CPU unreadable.
		result{round: 1, phase: phaseEnqueue, variant: enqueuePgonceMany, clients: 1, count: 100, elapsed: time.Second, serverCPU: 50 * time.Millisecond},
		result{round: 1, phase: phaseEnqueue, variant: enqueueRiverManyUnique, clients: 1, count: 100, elapsed: time.Second, serverCPU: -1},
		// The floor has the whole server's figure alone: 100 µs a row
		// against the drain's 300 µs a call (its share 200 µs).
		result{round: 0, phase: phaseDrain, variant: drainPgonceTuned, count: 100, elapsed: time.Second, serverCPU: 20 * time.Millisecond, serverCPUAll: 30 * time.Millisecond},
		result{round: 0, phase: phaseFloor, variant: floorPgbench, count: 100, elapsed: time.Second, serverCPU: -1, serverCPUAll: 10 * time.Millisecond},
	)
	sum := rs.summarize(s)
	ratios := map[string]ratio{}
	for _, q := range sum.ratios {
		ratios[q.name] = q
	}

	rates := ratios["enqueue 10 calls a tx: SubmitManyTx ÷ river InsertManyTx unique"]
	require.Equal(t, ratioRates, rates.kind)
	require.InDeltaSlice(t, []float64{2, 1}, rates.values, 1e-9)

	cpu := ratios[serverCPUPrefix+"enqueue 10 calls a tx: SubmitManyTx ÷ river InsertManyTx unique"]
	require.Equal(t, ratioServerCPU, cpu.kind)
	require.Equal(t, []int{0}, cpu.rounds, "round 1 has no river figure")
	require.InDeltaSlice(t, []float64{0.625}, cpu.values, 1e-9)

	floor := ratios[serverCPUPrefix+"floor: pgonce tuned drain ÷ pgbench model, whole server"]
	require.Equal(t, ratioServerCPUAll, floor.kind)
	require.InDeltaSlice(t, []float64{3}, floor.values, 1e-9, "the whole server's on both sides")

	for _, se := range sum.series {
		if se.variant == enqueueRiverManyUnique {
			require.InDeltaSlice(t, []float64{800}, se.serverCPUEach, 1e-9)
		}
	}

	text := sum.text(&environment{s: s})
	require.Contains(t, text, "server CPU 500.0 µs each")
	cpuAt := strings.Index(text, "\nserver CPU per call")
	require.Positive(t, cpuAt)
	require.Greater(t, strings.Index(text, serverCPUPrefix+"enqueue 10 calls"), cpuAt, "server CPU ratios print under their own heading")
}
