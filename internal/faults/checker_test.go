package faults_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/faults"
	"github.com/pgonce/pgonce/internal/ident"
)

// The checker is proven before it is trusted: each subtest breaks a healthy
// history in one way and requires the checker to say so.
func TestCheckerCatches(t *testing.T) {
	t.Parallel()

	// healthy returns a finished campaign of a few calls of every tool,
	// which the checker passes.
	healthy := func(t *testing.T) *bundle {
		t.Helper()
		b := setup(t, nil)
		for range 12 {
			b.load.SubmitOne(t.Context())
		}
		stop := b.runDispatcher(t)
		open, err := faults.AwaitTerminal(t.Context(), b.direct, b.schema, b.history.Keys())
		require.NoError(t, err)
		require.Zero(t, open)
		stop()
		report, err := faults.Check(t.Context(), b.direct, b.schema, b.checker, b.history, faults.CheckOpts{})
		require.NoError(t, err)
		require.NoError(t, report.Err())
		require.Equal(t, 12, report.Calls)
		require.Positive(t, report.RolledBack)
		return b
	}
	check := func(t *testing.T, b *bundle) *faults.Report {
		t.Helper()
		report, err := faults.Check(t.Context(), b.direct, b.schema, b.checker, b.history, faults.CheckOpts{})
		require.NoError(t, err)
		require.Error(t, report.Err())
		t.Logf("%s\n%v", report.Summary(), report.Violations)
		return report
	}
	exec := func(t *testing.T, b *bundle, sql string, args ...any) {
		t.Helper()
		tag, err := b.direct.Exec(t.Context(), sql, args...)
		require.NoError(t, err)
		require.Positive(t, tag.RowsAffected())
	}

	t.Run("InjectedDuplicate", func(t *testing.T) {
		t.Parallel()
		b := healthy(t)
		for _, tool := range faults.Tools {
			exec(t, b, `INSERT INTO `+ident.Quote(b.schema)+`.faults_effect (key, tool, natural_id, response)
				SELECT key, tool, natural_id, response FROM `+ident.Quote(b.schema)+`.faults_effect
				WHERE tool = $1 ORDER BY id LIMIT 1`, tool)
		}
		report := check(t, b)
		require.Equal(t, 3, report.Duplicates)
	})

	t.Run("ChangedResponse", func(t *testing.T) {
		t.Parallel()
		b := healthy(t)
		exec(t, b, `UPDATE `+ident.Quote(b.schema)+`.pgonce_key SET response = response || ' '::bytea
			WHERE key = (SELECT key FROM `+ident.Quote(b.schema)+`.pgonce_key WHERE state = 'succeeded' ORDER BY key LIMIT 1)`)
		report := check(t, b)
		require.Equal(t, 1, report.Mismatched)
	})

	t.Run("LostKey", func(t *testing.T) {
		t.Parallel()
		b := healthy(t)
		exec(t, b, `DELETE FROM `+ident.Quote(b.schema)+`.pgonce_key
			WHERE key = (SELECT key FROM `+ident.Quote(b.schema)+`.pgonce_key ORDER BY key LIMIT 1)`)
		report := check(t, b)
		require.Equal(t, 1, report.Lost)
	})

	t.Run("EffectOfRolledBackCall", func(t *testing.T) {
		t.Parallel()
		b := healthy(t)
		for _, e := range b.history.Entries() {
			if e.Fate == faults.FateRolledBack {
				exec(t, b, `INSERT INTO `+ident.Quote(b.schema)+`.faults_effect (key, tool, natural_id, response)
					VALUES ($1, $2, $3, '{}')`, string(e.Key), e.Call.Tool, e.Call.NaturalID)
				break
			}
		}
		report := check(t, b)
		require.Equal(t, 1, report.Phantom)
	})

	t.Run("AnswerDiffersFromStore", func(t *testing.T) {
		t.Parallel()
		b := healthy(t)
		// A Do that told its caller one response while the store holds
		// another.
		for _, e := range b.history.Entries() {
			if e.Fate == faults.FateCommitted {
				b.history.Observe(e.Key, []byte(`{"effect":"another"}`))
				break
			}
		}
		report := check(t, b)
		require.Equal(t, 1, report.Mismatched)
	})

	t.Run("Unfinished", func(t *testing.T) {
		t.Parallel()
		b := healthy(t)
		exec(t, b, `UPDATE `+ident.Quote(b.schema)+`.pgonce_key
			SET state = 'open', response = NULL, completed_at = NULL, expires_at = NULL, forget_at = NULL,
				available_at = now() + interval '1 hour', updated_at = now()
			WHERE key = (SELECT key FROM `+ident.Quote(b.schema)+`.pgonce_key WHERE state = 'succeeded' ORDER BY key LIMIT 1)`)
		report := check(t, b)
		require.Equal(t, 1, report.Unfinished)
	})

	t.Run("DroppedKnownOutcome", func(t *testing.T) {
		t.Parallel()
		b := healthy(t)
		// An at-most-once call whose provider answered a live worker, put in
		// review as if the answer had been lost.
		exec(t, b, `UPDATE `+ident.Quote(b.schema)+`.pgonce_key
			SET state = 'needs_review', response = NULL, completed_at = NULL, expires_at = NULL, forget_at = NULL, updated_at = now()
			WHERE key = (SELECT key FROM `+ident.Quote(b.schema)+`.pgonce_key
				WHERE state = 'succeeded' AND tool = $1 ORDER BY key LIMIT 1)`, faults.ToolOnce)
		report := check(t, b)
		require.Equal(t, 1, report.Dropped)
	})
}
