package migrations_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
)

// TestKeyInvariantsRefuseBrokenRows writes rows that break each invariant of
// pgonce_key, as an operator editing rows by hand might: the database
// refuses every one with a check violation named after the invariant, and
// the row stays as it was.
func TestKeyInvariantsRefuseBrokenRows(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgoncetest.Pool(t)
	schema := pgoncetest.Schema(t)
	table := pgx.Identifier{schema, "pgonce_key"}.Sanitize()

	// A pending step call, as a submit writes it.
	_, err := pool.Exec(ctx, `INSERT INTO `+table+` (key, scope, run_id, step, tool, args)
		VALUES (sha256('key'), sha256('scope'), 'run', 1, 'refund', '{}')`)
	require.NoError(t, err)
	snapshot := func() string {
		t.Helper()
		var row string
		require.NoError(t, pool.QueryRow(ctx, `SELECT row_to_json(k)::text FROM `+table+` AS k`).Scan(&row))
		return row
	}
	before := snapshot()

	for _, tc := range []struct {
		invariant string
		set       string
	}{
		{"pgonce_key_digests_check", "key = '\\x00'"},
		{"pgonce_key_digests_check", "fingerprint = sha224('x')"},
		{"pgonce_key_response_check", "response = '{}'"},
		{"pgonce_key_failure_check", "failure = '{}'"},
		{"pgonce_key_lease_check", "lease_until = now()"},
		{"pgonce_key_lease_check", "lease_until = now(), worker = 'w'"},
		{"pgonce_key_lease_check", "attempt = -1"},
		{"pgonce_key_available_check", "available_at = NULL"},
		{"pgonce_key_updated_check", "updated_at = NULL"},
		{"pgonce_key_completed_check", "completed_at = now()"},
		{"pgonce_key_retention_check", "expires_at = now()"},
		{"pgonce_key_retention_check", "forget_at = now()"},
		{"pgonce_key_tool_settings_check", "delivery = 4"},
		{"pgonce_key_tool_settings_check", "key_retention_ms = 0"},
		{"pgonce_key_tool_settings_check", "metadata = '{'"},
		{"pgonce_key_call_check", "tool = NULL"},
		{"pgonce_key_call_check", "state = 'expired', available_at = NULL, updated_at = NULL, completed_at = now(), forget_at = now()"},
		{"pgonce_key_expired_state_check", "expired_state = 'succeeded'"},
		{"pgonce_key_expired_state_check", "state = 'expired', available_at = NULL, updated_at = NULL, completed_at = now(), forget_at = now(), " +
			"tool = NULL, args = NULL, step = NULL, run_id = NULL"},
		{"pgonce_key_expired_state_check", "state = 'expired', available_at = NULL, updated_at = NULL, completed_at = now(), forget_at = now(), " +
			"tool = NULL, args = NULL, step = NULL, run_id = NULL, expired_state = 'open'"},
	} {
		t.Run(tc.set, func(t *testing.T) {
			_, err := pool.Exec(ctx, `UPDATE `+table+` SET `+tc.set)
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr, "want a check violation")
			require.Equal(t, "23514", pgErr.Code, "check_violation: %v", err)
			require.Equal(t, tc.invariant, pgErr.ConstraintName, "%v", err)
			require.Contains(t, pgErr.Message, tc.invariant)
			require.Equal(t, before, snapshot(), "the row is unchanged")
		})
	}

	t.Run("Insert", func(t *testing.T) {
		_, err := pool.Exec(ctx, `INSERT INTO `+table+` (key, scope, run_id, step, tool, args, response)
			VALUES (sha256('other'), sha256('other scope'), 'run', 2, 'refund', '{}', '{}')`)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, "want a check violation")
		require.Equal(t, "pgonce_key_response_check", pgErr.ConstraintName)
		var rows int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&rows))
		require.Equal(t, 1, rows)
	})
}
