package outbox_test

import (
	"database/sql"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

// TestFailoverDiff compares an "old primary" schema with a "new primary"
// schema that holds a copy of the old one's keys as they were at a cut, as a
// standby holds what it received: what the old one did after the cut is the
// difference. The old primary is read over pgx and the new one over
// database/sql.
func TestFailoverDiff(t *testing.T) {
	t.Parallel()

	type testBundle struct {
		oldPrimary *outbox.Client[pgx.Tx]
		newPrimary *outbox.Client[*sql.Tx]
		// same, claimedLater, lostPending and lostDone are the keys of the
		// scenario.
		same, claimedLater, lostPending, lostDone outbox.Key
	}

	setup := func(t *testing.T) *testBundle {
		t.Helper()
		oldConfig := refundConfig(t)
		newSchema := pgoncetest.Schema(t)
		oldPrimary, err := outbox.NewPgx(pgoncetest.Pool(t), oldConfig)
		require.NoError(t, err)
		newPrimary, err := outbox.New(pgoncetest.DB(t), outbox.Config{Schema: newSchema})
		require.NoError(t, err)

		same, err := oldPrimary.Do(t.Context(), refundCall("run-same"), nil)
		require.NoError(t, err)
		claimedLater, err := oldPrimary.Submit(t.Context(), refundCall("run-claimed-later"))
		require.NoError(t, err)

		// The standby received everything up to here.
		// Each schema has its own state type: rows go through their text.
		newTable := pgx.Identifier{newSchema, "pgonce_key"}.Sanitize()
		_, err = pgoncetest.Pool(t).Exec(t.Context(), `INSERT INTO `+newTable+` SELECT (o::text::`+newTable+`).* FROM `+
			pgx.Identifier{oldConfig.Schema, "pgonce_key"}.Sanitize()+` AS o`)
		require.NoError(t, err)

		done, err := oldPrimary.Do(t.Context(), refundCall("run-claimed-later"), nil)
		require.NoError(t, err)
		require.Equal(t, outbox.StateSucceeded, done.State)
		lostPending, err := oldPrimary.Submit(t.Context(), refundCall("run-lost-pending"))
		require.NoError(t, err)
		lostDone, err := oldPrimary.Do(t.Context(), refundCall("run-lost-done"), nil)
		require.NoError(t, err)
		return &testBundle{
			oldPrimary: oldPrimary, newPrimary: newPrimary,
			same: same.Key, claimedLater: claimedLater.Key, lostPending: lostPending.Key, lostDone: lostDone.Key,
		}
	}

	byKey := func(keys []outbox.FailoverDiffKey) map[outbox.Key]outbox.FailoverDiffKey {
		m := make(map[outbox.Key]outbox.FailoverDiffKey, len(keys))
		for _, k := range keys {
			m[k.Old.Key] = k
		}
		return m
	}

	t.Run("ListsMissingAndChangedKeysWithWhetherTheyActed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		res, err := outbox.FailoverDiff(t.Context(), b.oldPrimary, b.newPrimary, outbox.FailoverDiffParams{})
		require.NoError(t, err)
		require.Equal(t, 4, res.Compared)
		require.Empty(t, res.Cursor)
		diff := byKey(res.Keys)
		require.Len(t, diff, 3)
		require.NotContains(t, diff, b.same, "a key the new primary holds as it is is not listed")

		claimed := diff[b.claimedLater]
		require.False(t, claimed.Missing())
		require.Equal(t, outbox.StateSucceeded, claimed.Old.State)
		require.Equal(t, outbox.StatePending, claimed.New.State)
		require.True(t, claimed.Acted)

		pending := diff[b.lostPending]
		require.True(t, pending.Missing())
		require.Equal(t, outbox.StatePending, pending.Old.State)
		require.Equal(t, "refund", pending.Old.Tool)
		require.Equal(t, "run-lost-pending", pending.Old.RunID)
		require.False(t, pending.Acted)
		require.False(t, pending.Old.CreatedAt.IsZero())

		done := diff[b.lostDone]
		require.True(t, done.Missing())
		require.Equal(t, outbox.StateSucceeded, done.Old.State)
		require.True(t, done.Acted)
	})

	t.Run("PagesThroughEveryKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var (
			keys     []outbox.FailoverDiffKey
			compared int
			cursor   string
		)
		for pages := 1; ; pages++ {
			require.LessOrEqual(t, pages, 4, "one key a page")
			res, err := outbox.FailoverDiff(t.Context(), b.oldPrimary, b.newPrimary, outbox.FailoverDiffParams{Limit: 1, Cursor: cursor})
			require.NoError(t, err)
			require.Equal(t, 1, res.Compared)
			keys, compared, cursor = append(keys, res.Keys...), compared+res.Compared, res.Cursor
			if cursor == "" {
				break
			}
		}
		require.Equal(t, 4, compared)
		require.Len(t, byKey(keys), 3)
	})

	t.Run("ChangedSinceNarrowsTheComparison", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		res, err := outbox.FailoverDiff(t.Context(), b.oldPrimary, b.newPrimary,
			outbox.FailoverDiffParams{ChangedSince: time.Now().Add(time.Hour)})
		require.NoError(t, err)
		require.Zero(t, res.Compared)
		require.Empty(t, res.Keys)
	})

	t.Run("BadParamsChangeNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, params := range []outbox.FailoverDiffParams{
			{Limit: -1},
			{Limit: outbox.FailoverDiffLimitMax + 1},
			{Cursor: "not-a-cursor"},
			{Cursor: "f1_00"},
		} {
			_, err := outbox.FailoverDiff(t.Context(), b.oldPrimary, b.newPrimary, params)
			require.ErrorIs(t, err, outbox.ErrInvalidParams, "%+v", params)
		}
		_, err := outbox.FailoverDiff[pgx.Tx, *sql.Tx](t.Context(), b.oldPrimary, nil, outbox.FailoverDiffParams{})
		require.ErrorIs(t, err, outbox.ErrInvalidParams)
	})

	t.Run("NewPrimaryNotMigrated", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		unmigrated, err := outbox.New(pgoncetest.DB(t), outbox.Config{Schema: pgoncetest.NewSchemaName(t)})
		require.NoError(t, err)
		_, err = outbox.FailoverDiff(t.Context(), b.oldPrimary, unmigrated, outbox.FailoverDiffParams{})
		require.ErrorIs(t, err, outbox.ErrNotMigrated)
	})
}
