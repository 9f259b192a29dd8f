package main

import (
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

func TestFailoverDiff(t *testing.T) {
	t.Parallel()

	type testBundle struct {
		oldSchema, newSchema                string
		same, claimedLater, lost, lostActed outbox.Key
	}

	// setup makes an old primary's schema and a new primary's that holds
	// a copy of the old one's keys as they were at a cut, as a standby
	// holds what it received; what the old one did after the cut differs.
	setup := func(t *testing.T) *testBundle {
		t.Helper()
		old := newFixture(t)
		newSchema := pgoncetest.Schema(t)
		same := old.succeeded(t, "refund", `{"ok":true}`)
		claimedLater := old.pending(t, "email")

		// Each schema has its own state type: rows go through their text.
		newTable := pgx.Identifier{newSchema, "pgonce_key"}.Sanitize()
		_, err := pgoncetest.Pool(t).Exec(t.Context(), `INSERT INTO `+newTable+` SELECT (o::text::`+newTable+`).* FROM `+
			pgx.Identifier{old.schema, "pgonce_key"}.Sanitize()+` AS o`)
		require.NoError(t, err)

		old.exec(t, `UPDATE pgonce_key SET attempt = attempt + 1, worker = 'w1', lease_until = now() + interval '1 hour',
			first_attempted_at = now() WHERE key = $1`, pgoncetest.StoredKey(t, string(claimedLater)))
		lost := old.pending(t, "refund")
		lostActed := old.succeeded(t, "email", `{"sent":true}`)
		return &testBundle{
			oldSchema: old.schema, newSchema: newSchema,
			same: same, claimedLater: claimedLater, lost: lost, lostActed: lostActed,
		}
	}

	t.Run("ListsWhatTheNewPrimaryLacksAsJSON", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		dbURL := pgoncetest.DatabaseURL(t)
		res := pgonce(t, "failover-diff", "--old", dbURL, "--new", dbURL,
			"--old-schema", b.oldSchema, "--new-schema", b.newSchema, "--json")
		require.Equal(t, exitOK, res.code, res.stderr)
		out := decodeJSON(t, res.stdout)
		require.InDelta(t, 4, out["compared"], 0)
		require.InDelta(t, 2, out["acted"], 0)
		byKey := map[string]map[string]any{}
		for _, k := range out["keys"].([]any) {
			key := k.(map[string]any)
			byKey[key["key"].(string)] = key
		}
		require.Len(t, byKey, 3)
		require.NotContains(t, byKey, string(b.same))

		claimed := byKey[string(b.claimedLater)]
		require.Equal(t, "in_flight", claimed["old_state"])
		require.Equal(t, "pending", claimed["new_state"])
		require.Equal(t, false, claimed["missing"])
		require.Equal(t, true, claimed["acted"])
		require.Equal(t, "email", claimed["tool"])

		lost := byKey[string(b.lost)]
		require.Equal(t, "pending", lost["old_state"])
		require.NotContains(t, lost, "new_state")
		require.Equal(t, true, lost["missing"])
		require.Equal(t, false, lost["acted"])
		require.NotEmpty(t, lost["created_at"])

		lostActed := byKey[string(b.lostActed)]
		require.Equal(t, "succeeded", lostActed["old_state"])
		require.Equal(t, true, lostActed["missing"])
		require.Equal(t, true, lostActed["acted"])
	})

	t.Run("ReadsAReadOnlyOldPrimaryAsATable", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		dbURL := pgoncetest.DatabaseURL(t)
		readOnly, err := url.Parse(dbURL)
		require.NoError(t, err)
		query := readOnly.Query()
		query.Set("options", "-c default_transaction_read_only=on")
		// pgx reads "+" as itself, not as a space.
		readOnly.RawQuery = strings.ReplaceAll(query.Encode(), "+", "%20")
		res := pgonce(t, "failover-diff", "--old", readOnly.String(), "--new", dbURL,
			"--old-schema", b.oldSchema, "--new-schema", b.newSchema, "--fail-on-diff")
		require.Equal(t, exitAttention, res.code, res.stderr)
		require.Contains(t, res.stdout, "OLD STATE")
		require.Contains(t, res.stdout, string(b.lost))
		require.NotContains(t, res.stdout, string(b.same))
		require.Contains(t, res.stdout, "compared 4 keys of the old primary: 3 keys differ, 2 of them acted")
		require.Contains(t, res.stderr, "3 keys differ")
	})

	t.Run("NothingDiffers", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		dbURL := pgoncetest.DatabaseURL(t)
		res := pgonce(t, "--schema", b.oldSchema, "failover-diff", "--old", dbURL, "--new", dbURL, "--fail-on-diff")
		require.Equal(t, exitOK, res.code, res.stderr)
		require.Contains(t, res.stdout, "the new primary holds every one of the old primary's 4 keys as it is")
	})

	t.Run("BadInputIsAUsageError", func(t *testing.T) {
		t.Parallel()
		schema := pgoncetest.Schema(t)
		dbURL := pgoncetest.DatabaseURL(t)
		const nowhere = "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable"
		for _, tt := range []struct {
			name string
			args []string
			want string
		}{
			{"NoOld", []string{"--new", dbURL}, "--old and --new are required"},
			{"Unreachable", []string{"--old", nowhere, "--new", dbURL, "--schema", schema}, "--old: cannot reach PostgreSQL at " + nowhere},
			{"NotAPgonceSchema", []string{"--old", dbURL, "--new", dbURL, "--old-schema", schema, "--new-schema", "public"}, "--new: schema public at "},
			{"InvalidSchemaName", []string{"--old", dbURL, "--new", dbURL, "--old-schema", "Robert'); DROP"}, "--old-schema: invalid schema name"},
			{"BadSince", []string{"--old", dbURL, "--new", dbURL, "--since", "yesterday"}, `--since "yesterday"`},
		} {
			res := pgonce(t, append([]string{"failover-diff"}, tt.args...)...)
			require.Equal(t, exitUsage, res.code, "%s: %s", tt.name, res.stderr)
			require.Contains(t, res.stderr, tt.want, tt.name)
			require.Empty(t, res.stdout, tt.name)
		}
	})
}
