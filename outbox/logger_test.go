package outbox_test

import (
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/pgoncetest"
	"github.com/pgonce/pgonce/outbox"
)

// TestDefaultLoggerPassesWarningsAndErrorsOnly checks the level of the
// default Logger of both constructors: without a Logger, a client and what
// runs over it log warnings and errors, and nothing below.
func TestDefaultLoggerPassesWarningsAndErrorsOnly(t *testing.T) {
	t.Parallel()
	schema := pgoncetest.Schema(t)
	pgxClient, err := outbox.NewPgx(pgoncetest.Pool(t), outbox.Config{Schema: schema})
	require.NoError(t, err)
	stdClient, err := outbox.New(pgoncetest.DB(t), outbox.Config{Schema: schema})
	require.NoError(t, err)
	for _, logger := range []*slog.Logger{pgxClient.Config().Logger, stdClient.Config().Logger} {
		require.False(t, logger.Enabled(t.Context(), slog.LevelDebug))
		require.False(t, logger.Enabled(t.Context(), slog.LevelInfo))
		require.True(t, logger.Enabled(t.Context(), slog.LevelWarn))
		require.True(t, logger.Enabled(t.Context(), slog.LevelError))
		// Attributes and groups keep the level.
		require.False(t, logger.With("tool", "refund").WithGroup("call").Enabled(t.Context(), slog.LevelInfo))
		require.True(t, logger.With("tool", "refund").WithGroup("call").Enabled(t.Context(), slog.LevelWarn))
	}
}
