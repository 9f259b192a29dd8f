package outbox_test

import (
	"database/sql"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/idempotency"
	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/migrations"
	"github.com/pgonce/pgonce/outbox"
	"github.com/pgonce/pgonce/reconcile"
)

// TestBadConfig feeds the constructors of outbox, dispatcher and reconcile
// invalid configurations: each must refuse with its package's sentinel.
func TestBadConfig(t *testing.T) {
	t.Parallel()

	t.Run("Client", func(t *testing.T) {
		t.Parallel()
		for _, tt := range []struct {
			name   string
			config outbox.Config
			want   error
		}{
			{"SchemaNUL", outbox.Config{Schema: "pgonce\x00"}, outbox.ErrInvalidSchema},
			{"SchemaSQL", outbox.Config{Schema: sqlInName}, outbox.ErrInvalidSchema},
			{"SchemaMegabyte", outbox.Config{Schema: megabyte}, outbox.ErrInvalidSchema},
			{"SchemaReserved", outbox.Config{Schema: "pg_catalog"}, outbox.ErrInvalidSchema},
			{"CallTimeoutNegative", outbox.Config{CallTimeout: -time.Second}, outbox.ErrInvalidConfig},
			{"LeaseNegative", outbox.Config{Lease: -time.Second}, outbox.ErrInvalidConfig},
			{"LeaseShorterThanCall", outbox.Config{CallTimeout: time.Minute, Lease: time.Minute}, outbox.ErrInvalidConfig},
			{"RetentionNegative", outbox.Config{Retention: -time.Hour}, outbox.ErrInvalidConfig},
			{"TombstoneRetentionNegative", outbox.Config{TombstoneRetention: -time.Hour}, outbox.ErrInvalidConfig},
			{"WorkerIDMegabyte", outbox.Config{WorkerID: megabyte}, outbox.ErrInvalidConfig},
			{"WorkerIDNUL", outbox.Config{WorkerID: "host\x00:1"}, outbox.ErrInvalidConfig},
			{"WorkerIDInvalidUTF8", outbox.Config{WorkerID: "host\xff:1"}, outbox.ErrInvalidConfig},
		} {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				_, err := outbox.NewPgx(pgoncetest.Pool(t), tt.config)
				require.ErrorIs(t, err, tt.want)
				_, err = outbox.New(pgoncetest.DB(t), tt.config)
				require.ErrorIs(t, err, tt.want)
			})
		}
	})

	t.Run("NilPool", func(t *testing.T) {
		t.Parallel()
		for _, config := range []outbox.Config{{}, {Pooling: outbox.PoolingTransaction}} {
			client, err := outbox.NewPgx(nil, config)
			require.ErrorIs(t, err, outbox.ErrInvalidConfig)
			require.ErrorContains(t, err, "pool must not be nil")
			require.Nil(t, client)
		}
	})

	t.Run("NilDB", func(t *testing.T) {
		t.Parallel()
		client, err := outbox.New(nil, outbox.Config{})
		require.ErrorIs(t, err, outbox.ErrInvalidConfig)
		require.ErrorContains(t, err, "db must not be nil")
		require.Nil(t, client)
	})

	t.Run("NilDBInMigrations", func(t *testing.T) {
		t.Parallel()
		require.Error(t, migrations.Up(t.Context(), nil, "pgonce"))
		_, err := migrations.NewProvider(nil, "pgonce")
		require.Error(t, err)
	})

	t.Run("NilClientInIdempotency", func(t *testing.T) {
		t.Parallel()
		config := idempotency.Config{Tool: "refund", Mode: idempotency.ModeLease}
		_, err := idempotency.NewPgx(pgoncetest.Pool(t), nil, config)
		require.ErrorIs(t, err, idempotency.ErrInvalidConfig)
		_, err = idempotency.New(pgoncetest.DB(t), nil, config)
		require.ErrorIs(t, err, idempotency.ErrInvalidConfig)
	})

	t.Run("Dispatcher", func(t *testing.T) {
		t.Parallel()
		client, err := outbox.NewPgx(pgoncetest.Pool(t), outbox.Config{})
		require.NoError(t, err)
		for _, tt := range []struct {
			name   string
			config dispatcher.Config
		}{
			{"ConcurrencyNegative", dispatcher.Config{Concurrency: -1}},
			{"ConcurrencyHuge", dispatcher.Config{Concurrency: 1 << 40}},
			{"BatchSizeNegative", dispatcher.Config{BatchSize: -1}},
			{"BatchSizeHuge", dispatcher.Config{BatchSize: math.MaxInt32 + 1}},
			{"PollIntervalNegative", dispatcher.Config{PollInterval: -time.Second}},
			{"PollIntervalNanosecond", dispatcher.Config{PollInterval: time.Nanosecond}},
			{"MaxAttemptsNegative", dispatcher.Config{MaxAttempts: -1}},
			{"BackoffMinNegative", dispatcher.Config{BackoffMin: -time.Second}},
			{"BackoffMaxBelowMin", dispatcher.Config{BackoffMin: time.Minute, BackoffMax: time.Second}},
			{"ShutdownTimeoutNegative", dispatcher.Config{ShutdownTimeout: -2 * time.Second}},
			{"UnservedAfterNegative", dispatcher.Config{UnservedAfter: -2 * time.Second}},
		} {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				_, err := dispatcher.New(client, tt.config)
				require.ErrorIs(t, err, dispatcher.ErrInvalidConfig)
			})
		}
		t.Run("NilClient", func(t *testing.T) {
			t.Parallel()
			_, err := dispatcher.New[*sql.Tx](nil, dispatcher.Config{})
			require.ErrorIs(t, err, dispatcher.ErrInvalidConfig)
		})
	})

	t.Run("Reconciler", func(t *testing.T) {
		t.Parallel()
		client, err := outbox.NewPgx(pgoncetest.Pool(t), outbox.Config{})
		require.NoError(t, err)
		for _, tt := range []struct {
			name   string
			config reconcile.Config
		}{
			{"GraceNegative", reconcile.Config{Grace: -time.Second}},
			{"BatchSizeNegative", reconcile.Config{BatchSize: -1}},
			{"BatchSizeHuge", reconcile.Config{BatchSize: math.MaxInt32 + 1}},
			{"StalePendingNegative", reconcile.Config{StalePending: -time.Second}},
		} {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				_, err := reconcile.New(client, tt.config)
				require.ErrorIs(t, err, reconcile.ErrInvalidConfig)
			})
		}
		t.Run("NilClient", func(t *testing.T) {
			t.Parallel()
			_, err := reconcile.New[*sql.Tx](nil, reconcile.Config{})
			require.ErrorIs(t, err, reconcile.ErrInvalidConfig)
		})
		t.Run("RunEveryNotPositive", func(t *testing.T) {
			t.Parallel()
			r, err := reconcile.New(client, reconcile.Config{})
			require.NoError(t, err)
			require.ErrorIs(t, r.Run(t.Context(), -time.Second), reconcile.ErrInvalidConfig)
			require.ErrorIs(t, r.Run(t.Context(), 0), reconcile.ErrInvalidConfig)
		})
	})
}
