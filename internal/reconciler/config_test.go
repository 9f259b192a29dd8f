package reconciler

import (
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgonce/pgonce/internal/attempt"
)

// wired is a Config with its wiring and none of its settings.
func wired() Config {
	return Config{
		Logger:    slog.New(slog.DiscardHandler),
		Runner:    attempt.New(nil, attempt.Config{}),
		ToolsFunc: func() []string { return nil },
	}
}

func TestNew(t *testing.T) {
	t.Parallel()

	t.Run("ZeroSettingsTakeTheDefaults", func(t *testing.T) {
		t.Parallel()
		engine, err := New(wired())
		require.NoError(t, err)
		require.Equal(t, GraceDefault, engine.config.Grace)
		require.Equal(t, BatchSizeDefault, engine.config.BatchSize)
		require.Equal(t, StalePendingDefault, engine.config.StalePending)
	})

	t.Run("InvalidSettingsAreRefusedByName", func(t *testing.T) {
		t.Parallel()
		for _, tt := range []struct {
			name  string
			set   func(*Config)
			field string
		}{
			{"GraceNegative", func(c *Config) { c.Grace = -time.Second }, "Grace"},
			{"BatchSizeNegative", func(c *Config) { c.BatchSize = -1 }, "BatchSize"},
			{"BatchSizeAboveMax", func(c *Config) { c.BatchSize = BatchSizeMax + 1 }, "BatchSize"},
			{"StalePendingNegative", func(c *Config) { c.StalePending = -time.Second }, "StalePending"},
		} {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				config := wired()
				tt.set(&config)
				_, err := New(config)
				require.ErrorIs(t, err, ErrInvalidConfig)
				require.ErrorContains(t, err, tt.field)
			})
		}
	})

	t.Run("MissingWiringPanics", func(t *testing.T) {
		t.Parallel()
		for _, unwire := range []func(*Config){
			func(c *Config) { c.Runner = nil },
			func(c *Config) { c.ToolsFunc = nil },
			func(c *Config) { c.Logger = nil },
		} {
			config := wired()
			unwire(&config)
			require.Panics(t, func() { _, _ = New(config) })
		}
	})
}
