package outbox_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

// tableHashes returns a digest of every row of schema's pgonce tables, so a
// test can show that a refused request changed no byte of them.
func tableHashes(t *testing.T, schema string) map[string]string {
	t.Helper()
	hashes := make(map[string]string)
	for _, table := range []string{"pgonce_key", "pgonce_resolution", "pgonce_attempt"} {
		var hash string
		require.NoError(t, pgoncetest.Pool(t).QueryRow(t.Context(),
			`SELECT count(*) || ':' || coalesce(md5(string_agg(t::text, ',' ORDER BY t::text)), '') FROM `+
				ident.Quote(schema)+`.`+table+` t`).Scan(&hash))
		hashes[table] = hash
	}
	return hashes
}

// needsReviewKey submits call and moves its key to needs review, as an
// uncertain attempt of an at-most-once tool leaves it.
func needsReviewKey[TTx any](t *testing.T, client *outbox.Client[TTx], schema string, call outbox.Call) outbox.Key {
	t.Helper()
	res, err := client.Submit(t.Context(), call)
	require.NoError(t, err)
	_, err = pgoncetest.Pool(t).Exec(t.Context(),
		`UPDATE `+ident.Quote(schema)+`.pgonce_key SET state = 'needs_review', attempt = 1, available_at = NULL WHERE key = $1`,
		pgoncetest.StoredKey(t, string(res.Key)))
	require.NoError(t, err)
	return res.Key
}
