package dispatcher_test

import (
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/pgoncetest/drivertest"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/reconcile"
)

// maintenanceConfig is fastConfig with maintenance every 100ms and a
// reconciler that resolves a lease as soon as it expires.
func maintenanceConfig() dispatcher.Config {
	config := fastConfig()
	config.MaintenanceInterval = 100 * time.Millisecond
	config.Reconcile = dispatcher.ReconcileConfig{Grace: time.Millisecond}
	return config
}

// leader is a row of pgonce_leader.
type leader struct {
	name, id  string
	electedAt time.Time
	expiresAt time.Time
}

// leaders reads schema's leaderships.
func leaders(t *testing.T, schema string) []leader {
	t.Helper()
	rows, err := pgoncetest.Pool(t).Query(t.Context(),
		`SELECT name, leader_id, elected_at, expires_at FROM `+ident.Quote(schema)+`.pgonce_leader ORDER BY name`)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (leader, error) {
		var l leader
		err := row.Scan(&l.name, &l.id, &l.electedAt, &l.expiresAt)
		return l, err
	})
	require.NoError(t, err)
	return out
}

// awaitLeader waits until schema's one leadership is held by a candidate of
// workerID, and returns it.
func awaitLeader(t *testing.T, schema, workerID string) leader {
	t.Helper()
	var got []leader
	require.Eventually(t, func() bool {
		got = leaders(t, schema)
		return len(got) == 1 && strings.HasPrefix(got[0].id, workerID+":")
	}, time.Minute, 5*time.Millisecond, "worker %s never led", workerID)
	return got[0]
}

func TestMaintenance(t *testing.T) {
	t.Parallel()
	drivertest.All(t, testMaintenance[pgx.Tx], testMaintenance[*sql.Tx])
}

func testMaintenance[TTx any](t *testing.T, driver drivertest.Driver[TTx]) {
	t.Helper()

	clientAs := func(t *testing.T, b *testBundle[TTx], workerID string) *outbox.Client[TTx] {
		t.Helper()
		return b.driver.Client(t, outbox.Config{Schema: b.schema, Registry: b.registry, WorkerID: workerID})
	}

	t.Run("OneOfTwoIsElectedAndTheOtherTakesOverWhenItStops", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver)
		var stops [2]func()
		workers := [2]string{"worker-a", "worker-b"}
		for i, worker := range workers {
			d, err := dispatcher.New(clientAs(t, b, worker), maintenanceConfig())
			require.NoError(t, err)
			stops[i] = start(t, d)
		}
		// Exactly one leads, and renews its leadership.
		var first leader
		require.Eventually(t, func() bool {
			got := leaders(t, b.schema)
			if len(got) == 1 {
				first = got[0]
			}
			return len(got) == 1
		}, time.Minute, 5*time.Millisecond)
		submit(t, b.client, "refund", 1)
		current := awaitRenewal(t, b.schema, first)
		leaderIndex := 0
		if strings.HasPrefix(current.id, workers[1]+":") {
			leaderIndex = 1
		}
		stops[leaderIndex]()
		next := awaitLeader(t, b.schema, workers[1-leaderIndex])
		require.NotEqual(t, current.id, next.id)
		require.Len(t, leaders(t, b.schema), 1)
	})

	t.Run("CrashedLeaderIsReplacedAndAStrandedKeyResolved", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver)
		// A leader elected, then gone without resigning: its row stays
		// until its lease expires. The stopped dispatcher resigned, unless
		// its stop cut off the election it had just won (then it does not
		// know it led, and its row is still there): either way the row is
		// made the dead leader's.
		first, err := dispatcher.New(clientAs(t, b, "worker-crashed"), maintenanceConfig())
		require.NoError(t, err)
		stopFirst := start(t, first)
		elected := awaitLeader(t, b.schema, "worker-crashed")
		stopFirst()
		_, err = pgoncetest.Pool(t).Exec(t.Context(),
			`INSERT INTO `+ident.Quote(b.schema)+`.pgonce_leader (name, leader_id, elected_at, expires_at)
			VALUES ($1, 'worker-crashed/dead', now(), now() + interval '300 milliseconds')
			ON CONFLICT (name) DO UPDATE SET leader_id = excluded.leader_id, elected_at = excluded.elected_at,
				expires_at = excluded.expires_at`, elected.name)
		require.NoError(t, err)
		dead := leaders(t, b.schema)[0]

		// A key left in flight by a worker that crashed mid-call.
		key := submit(t, b.client, "refund", 7)
		pgoncetest.AbandonKeys(t, b.schema, time.Second, key)

		second, err := dispatcher.New(clientAs(t, b, "worker-live"), maintenanceConfig())
		require.NoError(t, err)
		start(t, second)
		res := awaitState(t, b.client, key, outbox.StateSucceeded)
		require.Equal(t, 3, res.Attempts, "abandoned at 1, reclaimed by the reconciler at 2, dispatched at 3")
		next := awaitLeader(t, b.schema, "worker-live")
		require.False(t, next.electedAt.Before(dead.expiresAt), "elected only once the crashed leader's lease expired")
		calls, effects := b.ledger.count(key)
		require.Equal(t, 1, calls)
		require.Equal(t, 1, effects)
	})

	t.Run("MaintenanceDisabledElectsNobody", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver)
		stranded := submit(t, b.client, "refund", 1)
		pgoncetest.AbandonKeys(t, b.schema, time.Second, stranded)
		config := maintenanceConfig()
		config.MaintenanceDisabled = true
		d, err := dispatcher.New(b.client, config)
		require.NoError(t, err)
		start(t, d)
		awaitState(t, b.client, submit(t, b.client, "refund", 2), outbox.StateSucceeded)
		require.Empty(t, leaders(t, b.schema))
		res, err := b.client.Get(t.Context(), stranded)
		require.NoError(t, err)
		require.Equal(t, outbox.StateInFlight, res.State)
	})

	t.Run("InvalidReconcileConfigIsRefused", func(t *testing.T) {
		t.Parallel()
		b := setup(t, driver)
		config := fastConfig()
		config.Reconcile.Grace = -time.Second
		_, err := dispatcher.New(b.client, config)
		require.ErrorIs(t, err, dispatcher.ErrInvalidConfig)
		require.ErrorIs(t, err, reconcile.ErrInvalidConfig)
		config.Reconcile.Grace, config.MaintenanceInterval = 0, time.Millisecond
		_, err = dispatcher.New(b.client, config)
		require.ErrorIs(t, err, dispatcher.ErrInvalidConfig)
		require.NotErrorIs(t, err, reconcile.ErrInvalidConfig)
	})
}

// awaitRenewal waits until the leadership after was renewed, and returns it.
func awaitRenewal(t *testing.T, schema string, after leader) leader {
	t.Helper()
	var got []leader
	require.Eventually(t, func() bool {
		got = leaders(t, schema)
		return len(got) == 1 && got[0].expiresAt.After(after.expiresAt)
	}, time.Minute, 5*time.Millisecond, "leadership never renewed")
	return got[0]
}
