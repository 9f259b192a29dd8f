package sdktest_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"maps"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/telemetry"
)

func TestGauges(t *testing.T) {
	t.Parallel()
	drivertest.Each(t, testGauges[pgx.Tx], testGauges[*sql.Tx])
}

// gaugeReading is what one reader saw of the gauges, by tool and state
// ("oldest_pending_age" for the age, in seconds).
type gaugeReading map[[2]string]float64

func readGauges(t *testing.T, bundle *testBundle) gaugeReading {
	t.Helper()
	reading := gaugeReading{}
	if data, ok := metricsNamed(t, bundle, telemetry.MetricKeyCount).(metricdata.Sum[int64]); ok {
		require.False(t, data.IsMonotonic)
		for _, dp := range data.DataPoints {
			require.Equal(t, bundle.schema, value(dp.Attributes, "db.namespace"))
			reading[[2]string{value(dp.Attributes, telemetry.AttrTool), value(dp.Attributes, telemetry.AttrState)}] = float64(dp.Value)
		}
	}
	if data, ok := metricsNamed(t, bundle, telemetry.MetricOldestPending).(metricdata.Gauge[float64]); ok {
		for _, dp := range data.DataPoints {
			reading[[2]string{value(dp.Attributes, telemetry.AttrTool), "oldest_pending_age"}] = dp.Value
		}
	}
	return reading
}

func testGauges[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()
	// Two processes, each with its telemetry, share a schema; one calls
	// refunds one at a time and holds the first until the end.
	first := setup(t)
	second := setup(t)
	second.schema = first.schema
	release := make(chan struct{})
	registry := func() *outbox.Registry {
		registry := outbox.NewRegistry()
		require.NoError(t, registry.Register("refund", outbox.ProviderFunc(func(ctx context.Context, _ outbox.Request) (json.RawMessage, error) {
			select {
			case <-release:
			case <-ctx.Done():
			}
			return json.RawMessage(`{}`), nil
		}), outbox.IdempotentByKey))
		require.NoError(t, registry.Register("email", outbox.ProviderFunc(func(context.Context, outbox.Request) (json.RawMessage, error) {
			return nil, outbox.Ambiguous(errors.New("timeout after send"))
		}), outbox.AtMostOnce))
		return registry
	}
	var clients []*outbox.Client[TTx]
	for _, bundle := range []*testBundle{first, second} {
		clients = append(clients, driver.Client(t, outbox.Config{
			Schema: bundle.schema, Registry: registry(), Middleware: []outbox.Middleware{bundle.tel},
			CallTimeout: time.Minute, Lease: 2 * time.Minute,
		}))
	}
	client := clients[0]
	_, err := client.Do(t.Context(), outbox.Call{RunID: "r", Step: 100, Tool: "email", Args: 0}, nil)
	require.NoError(t, err)
	for step := range 3 {
		_, err := client.Submit(t.Context(), outbox.Call{RunID: "r", Step: int64(step), Tool: "refund", Args: step})
		require.NoError(t, err)
	}

	// Before any dispatcher leads, nothing is reported.
	require.Empty(t, readGauges(t, first))
	for _, c := range clients {
		d, err := dispatcher.New(c, dispatcher.Config{Concurrency: 1, BatchSize: 1, PollInterval: 10 * time.Millisecond, MaintenanceInterval: 20 * time.Millisecond})
		require.NoError(t, err)
		runCtx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(runCtx) }()
		t.Cleanup(func() {
			stop()
			require.NoError(t, <-done)
		})
	}

	// Registered after the dispatchers' cleanups, this runs before them:
	// their calls return, and they stop at once.
	t.Cleanup(func() { close(release) })

	// Each dispatcher holds one refund in flight; one pending is left.
	var stats outbox.Stats
	require.Eventually(t, func() bool {
		var err error
		stats, err = client.Stats(t.Context())
		require.NoError(t, err)
		return stats.Keys["refund"][outbox.StateInFlight] == 2
	}, time.Minute, 5*time.Millisecond)
	want := gaugeReading{
		{"refund", "pending"}:      float64(stats.Keys["refund"][outbox.StatePending]),
		{"refund", "in_flight"}:    float64(stats.Keys["refund"][outbox.StateInFlight]),
		{"refund", "needs_review"}: 0,
		{"email", "pending"}:       0,
		{"email", "in_flight"}:     0,
		{"email", "needs_review"}:  float64(stats.Keys["email"][outbox.StateNeedsReview]),
	}
	require.Equal(t, gaugeReading{
		{"refund", "pending"}: 1, {"refund", "in_flight"}: 2, {"refund", "needs_review"}: 0,
		{"email", "pending"}: 0, {"email", "in_flight"}: 0, {"email", "needs_review"}: 1,
	}, want)

	// The leader reports what Stats says, the other process nothing.
	var leader, other *testBundle
	require.Eventually(t, func() bool {
		for _, pair := range [][2]*testBundle{{first, second}, {second, first}} {
			reading := readGauges(t, pair[0])
			for key := range reading {
				if key[1] == "oldest_pending_age" {
					delete(reading, key)
				}
			}
			if len(reading) > 0 && equalReadings(reading, want) {
				leader, other = pair[0], pair[1]
				return true
			}
		}
		return false
	}, time.Minute, 5*time.Millisecond)
	require.Empty(t, readGauges(t, other))
	// The oldest pending refund ages from one reading to the next, as Stats
	// says; a tool with none pending reports 0. The age is in whole
	// milliseconds, and a maintenance pass within a millisecond of the
	// refund's submit reads 0: the first reading awaited is a positive one.
	var firstAge float64
	require.Eventually(t, func() bool {
		reading := readGauges(t, leader)
		require.Zero(t, reading[[2]string{"email", "oldest_pending_age"}])
		firstAge = reading[[2]string{"refund", "oldest_pending_age"}]
		return firstAge > 0
	}, time.Minute, 5*time.Millisecond)
	require.Eventually(t, func() bool {
		return readGauges(t, leader)[[2]string{"refund", "oldest_pending_age"}] > firstAge
	}, time.Minute, 5*time.Millisecond)
	// A reading is never ahead of Stats read after it.
	lastAge := readGauges(t, leader)[[2]string{"refund", "oldest_pending_age"}]
	stats, err = client.Stats(t.Context())
	require.NoError(t, err)
	require.GreaterOrEqual(t, stats.OldestPendingByTool["refund"].Seconds(), lastAge)

	// A paused tool reads 1, the others 0. A reading goes stale within
	// three maintenance intervals of the pass that took it, and leadership
	// may move between the processes: the readings of both are merged, as
	// a backend would sum them.
	both := func() map[string]int64 {
		reading := readPaused(t, first)
		maps.Copy(reading, readPaused(t, second))
		return reading
	}
	require.Eventually(t, func() bool {
		return maps.Equal(both(), map[string]int64{"refund": 0, "email": 0})
	}, time.Minute, 5*time.Millisecond)
	_, err = client.Pause(t.Context(), "email", outbox.PauseParams{By: "alice", Reason: "provider incident"})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return maps.Equal(both(), map[string]int64{"refund": 0, "email": 1})
	}, time.Minute, 5*time.Millisecond)
	_, err = client.Resume(t.Context(), "email", outbox.ResumeParams{By: "alice"})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return maps.Equal(both(), map[string]int64{"refund": 0, "email": 0})
	}, time.Minute, 5*time.Millisecond)
}

// readPaused is what one reader saw of the paused-tools gauge, by tool.
func readPaused(t *testing.T, bundle *testBundle) map[string]int64 {
	t.Helper()
	reading := map[string]int64{}
	if data, ok := metricsNamed(t, bundle, telemetry.MetricToolPaused).(metricdata.Gauge[int64]); ok {
		for _, dp := range data.DataPoints {
			require.Equal(t, bundle.schema, value(dp.Attributes, "db.namespace"))
			reading[value(dp.Attributes, telemetry.AttrTool)] = dp.Value
		}
	}
	return reading
}

func equalReadings(a, b gaugeReading) bool {
	if len(a) != len(b) {
		return false
	}
	for key, v := range a {
		if w, ok := b[key]; !ok || w != v {
			return false
		}
	}
	return true
}
