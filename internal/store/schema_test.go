package store_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/internal/store"
	"github.com/pgonce/pgonce/migrations"
)

// TestSchemaVersionIsTheNewestMigration keeps the store's SchemaVersion, a
// constant so that the store imports no public package, equal to the
// newest migration file.
func TestSchemaVersionIsTheNewestMigration(t *testing.T) {
	t.Parallel()

	// A schema that does not exist: Version writes nothing.
	current, latest, err := migrations.Version(t.Context(), pgoncetest.DB(t), pgoncetest.NewSchemaName(t))
	require.NoError(t, err)
	require.Zero(t, current)
	require.Equal(t, latest, int64(store.SchemaVersion))
}

func TestCheckSchema(t *testing.T) {
	t.Parallel()

	t.Run("MigratedSchemaPasses", func(t *testing.T) {
		t.Parallel()
		for name, open := range drivers(t) {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				st, _ := open(t)
				require.NoError(t, st.CheckSchema(t.Context()))
			})
		}
	})

	t.Run("MissingSchemaIsVersionZero", func(t *testing.T) {
		t.Parallel()
		schema := pgoncetest.NewSchemaName(t)
		pgx, err := store.NewPgxDriver(pgoncetest.Pool(t), schema)
		require.NoError(t, err)
		std, err := store.NewStdDriver(pgoncetest.DB(t), schema)
		require.NoError(t, err)
		for name, st := range map[string]*store.Store{"Pgx": pgx.Store(), "Std": std.Store()} {
			err := st.CheckSchema(t.Context())
			var notMigrated *store.NotMigratedError
			require.ErrorAs(t, err, &notMigrated, name)
			require.Equal(t, int64(0), notMigrated.Applied, name)
			require.Equal(t, int64(store.SchemaVersion), notMigrated.Needed, name)
		}
	})
}
