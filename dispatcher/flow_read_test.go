package dispatcher_test

import (
	"context"
	"database/sql"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
)

// statementCounter is a pgx tracer that counts the statements a pool ran,
// alone or in a batch, by the name sqlc gives them ("-- name: ToolList").
type statementCounter struct {
	mu     sync.Mutex
	counts map[string]int
}

func (c *statementCounter) add(sql string) {
	name, ok := strings.CutPrefix(sql, "-- name: ")
	if !ok {
		return
	}
	name, _, _ = strings.Cut(name, " ")
	c.mu.Lock()
	c.counts[name]++
	c.mu.Unlock()
}

func (c *statementCounter) count(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[name]
}

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.add(data.SQL)
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *statementCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (c *statementCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	c.add(data.SQL)
}

func (c *statementCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// countedPool returns a pool over url whose statements counter counts.
func countedPool(t *testing.T, url string) (*pgxpool.Pool, *statementCounter) {
	t.Helper()
	config, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	counter := &statementCounter{counts: map[string]int{}}
	config.ConnConfig.Tracer = counter
	config.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(t.Context(), config)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, counter
}

func TestFlowToolListReadWhenNotified(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testFlowToolListReadWhenNotified[pgx.Tx], testFlowToolListReadWhenNotified[*sql.Tx])
}

// testFlowToolListReadWhenNotified runs a dispatcher that polls every 5ms
// while no tool has flow control: it reads the tools' flow control when it
// starts and when its listener connects, not at every poll; a pause made
// later reaches it by its notification (its MaintenanceInterval, the
// fallback, is an hour), and from then on the paused tool's keys wait. A
// dispatcher that hears no notification reads the tools' flow control every
// MaintenanceInterval, and a pause reaches it so.
func testFlowToolListReadWhenNotified[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()

	// pauseReaches starts a dispatcher over a counted pool, checks that its
	// polls do not read the tools' flow control when notify is true, pauses
	// refund, and checks that the dispatcher holds refund's keys from then
	// on.
	pauseReaches := func(t *testing.T, notify bool, maintenance time.Duration) {
		t.Helper()
		bundle := setup(t, driver)
		pool, counter := countedPool(t, driver.URL(t))
		client := driver.ClientOver(t, pool, outbox.Config{Schema: bundle.schema, Registry: bundle.registry, NotifyDisabled: !notify})
		start(t, mustDispatcherWith(t, client, dispatcher.Config{
			PollInterval: 5 * time.Millisecond, MaintenanceInterval: maintenance, MaintenanceDisabled: true,
		}))

		if notify {
			const polls = 100
			require.Eventually(t, func() bool { return counter.count("OutboxClaimBatch") >= polls },
				time.Minute, 5*time.Millisecond)
			// The first claim's read, and the read after the listener
			// connected.
			require.LessOrEqual(t, counter.count("ToolList"), 2,
				"%d polls without flow control read the tools' flow control", counter.count("OutboxClaimBatch"))
		}

		_, err := bundle.client.Pause(t.Context(), "refund", outbox.PauseParams{By: "alice", Reason: "provider incident"})
		require.NoError(t, err)
		// The dispatcher claims refund's keys through the controlled claim
		// only once it knows that refund has a row.
		require.Eventually(t, func() bool { return counter.count("OutboxClaimControlled") > 0 },
			time.Minute, 5*time.Millisecond, "the pause reached the dispatcher")
		paused := submit(t, bundle.client, "refund", 1)
		other := submit(t, bundle.client, "provision", 2)
		awaitState(t, bundle.client, other, outbox.StateSucceeded)
		res, err := bundle.client.Get(t.Context(), paused)
		require.NoError(t, err)
		require.Equal(t, outbox.StatePending, res.State)
		calls, _ := bundle.ledger.count(paused)
		require.Zero(t, calls)
	}

	t.Run("NotifiedWithoutAReadPerPoll", func(t *testing.T) {
		t.Parallel()
		pauseReaches(t, true, time.Hour)
	})
	t.Run("UnnotifiedWithinMaintenanceInterval", func(t *testing.T) {
		t.Parallel()
		pauseReaches(t, false, 50*time.Millisecond)
	})
}

func TestFlowPauseReachesAnUnnotifiedDispatcher(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testFlowPauseReachesAnUnnotifiedDispatcher[pgx.Tx], testFlowPauseReachesAnUnnotifiedDispatcher[*sql.Tx])
}

// testFlowPauseReachesAnUnnotifiedDispatcher checks how soon a pause
// reaches a dispatcher that hears no notification (docs/flow-control.md,
// "How soon a change reaches the dispatchers"): at its next claim for a
// tool it knows to have flow control, whose claim reads the tool's row;
// not before its MaintenanceInterval, the next read of which tools have a
// row, for a tool that had none.
func testFlowPauseReachesAnUnnotifiedDispatcher[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()

	// startUnnotified starts a dispatcher that never hears a notification
	// and reads which tools have flow control only when it starts (its
	// MaintenanceInterval is an hour), and waits for its first claim, which
	// comes after that read has returned (a statement is counted when it
	// starts).
	startUnnotified := func(t *testing.T, bundle *testBundle[TTx]) *statementCounter {
		t.Helper()
		pool, counter := countedPool(t, driver.URL(t))
		client := driver.ClientOver(t, pool, outbox.Config{Schema: bundle.schema, Registry: bundle.registry, NotifyDisabled: true})
		start(t, mustDispatcherWith(t, client, dispatcher.Config{
			PollInterval: 5 * time.Millisecond, MaintenanceInterval: time.Hour, MaintenanceDisabled: true,
		}))
		require.Eventually(t, func() bool { return counter.count("OutboxClaimBatch") > 0 }, time.Minute, 5*time.Millisecond)
		require.Equal(t, 1, counter.count("ToolList"))
		return counter
	}

	t.Run("AToolWithFlowControlAtTheNextClaim", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		_, err := bundle.client.SetToolLimits(t.Context(), "refund", outbox.ToolLimits{MaxInFlight: 100},
			outbox.LimitParams{By: "alice", Reason: "provider quota"})
		require.NoError(t, err)
		counter := startUnnotified(t, bundle)
		require.Eventually(t, func() bool { return counter.count("OutboxClaimControlled") > 0 }, time.Minute, 5*time.Millisecond)

		_, err = bundle.client.Pause(t.Context(), "refund", outbox.PauseParams{By: "alice", Reason: "provider incident"})
		require.NoError(t, err)
		paused := submit(t, bundle.client, "refund", 1)
		other := submit(t, bundle.client, "provision", 2)
		// The claim that took the other tool's key read refund's row.
		awaitState(t, bundle.client, other, outbox.StateSucceeded)
		res, err := bundle.client.Get(t.Context(), paused)
		require.NoError(t, err)
		require.Equal(t, outbox.StatePending, res.State)
		calls, _ := bundle.ledger.count(paused)
		require.Zero(t, calls)
	})

	t.Run("AToolWithoutFlowControlNotBeforeMaintenanceInterval", func(t *testing.T) {
		t.Parallel()
		bundle := setup(t, driver)
		counter := startUnnotified(t, bundle)

		_, err := bundle.client.Pause(t.Context(), "refund", outbox.PauseParams{By: "alice", Reason: "provider incident"})
		require.NoError(t, err)
		// The dispatcher polls every 5ms, but takes refund's keys with the
		// plain claim until it reads which tools have a row again.
		key := submit(t, bundle.client, "refund", 1)
		awaitState(t, bundle.client, key, outbox.StateSucceeded)
		require.Zero(t, counter.count("OutboxClaimControlled"))
	})
}

func mustDispatcherWith[TTx any](t *testing.T, client *outbox.Client[TTx], config dispatcher.Config) *dispatcher.Dispatcher[TTx] {
	t.Helper()
	d, err := dispatcher.New(client, config)
	require.NoError(t, err)
	return d
}

func TestFlowRateHeldToolWaitsForItsTokens(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testFlowRateHeldToolWaitsForItsTokens[pgx.Tx], testFlowRateHeldToolWaitsForItsTokens[*sql.Tx])
}

// testFlowRateHeldToolWaitsForItsTokens drains a backlog of a tool limited
// to 5 calls a second, one at a time, with a dispatcher whose every call
// frees a slot and wakes its claim loop: the dispatcher claims the tool
// again when its next token is due, not at every wake-up before it, when
// the claim would lock the tool's row to find no token. About one
// controlled claim a key; claiming at every wake-up took two.
func testFlowRateHeldToolWaitsForItsTokens[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()
	bundle := setup(t, driver)
	_, err := bundle.client.SetToolLimits(t.Context(), "refund", outbox.ToolLimits{Rate: 5, Burst: 1},
		outbox.LimitParams{By: "test", Reason: "five a second"})
	require.NoError(t, err)
	const keys = 10
	submitted := bundle.submitAll(t, bundle.client, callsFrom("refund", 0, keys))
	pool, counter := countedPool(t, driver.URL(t))
	client := driver.ClientOver(t, pool, outbox.Config{Schema: bundle.schema, Registry: bundle.registry})
	start(t, mustDispatcherWith(t, client, dispatcher.Config{
		PollInterval: 10 * time.Second, Concurrency: 10, BatchSize: 10, MaintenanceDisabled: true,
	}))
	for _, key := range submitted {
		awaitState(t, bundle.client, key, outbox.StateSucceeded)
	}
	// One claim a token, the first claim's, and one after the listener
	// connected (it reads the tools' flow control again and claims held
	// tools at once).
	require.LessOrEqual(t, counter.count("ToolLock"), keys+2,
		"controlled claims for %d keys at one token each", keys)
}
