package reconciler

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/pgonce/pgonce/internal/attempt"
)

// Defaults of [Config]: the reconcile package documents them to its users,
// and a dispatcher's maintenance reconciler has the same.
const (
	GraceDefault        = 30 * time.Second
	BatchSizeDefault    = 32
	StalePendingDefault = 10 * time.Minute
	// BatchSizeMax is the largest [Config.BatchSize].
	BatchSizeMax = 1000
)

// ErrInvalidConfig is returned by [New] for invalid settings. Package
// reconcile exports it, and the dispatcher wraps it for its maintenance
// reconciler's settings, so that errors.Is matches either way.
var ErrInvalidConfig = errors.New("invalid reconcile config")

// Config is what an [Engine] needs: the settings its user chose, whose zero
// values mean the defaults, and what it needs of the client it serves,
// passed by the package that makes it (reconcile, or the dispatcher's
// maintenance).
type Config struct {
	// Grace is how long past its lease an in-flight row waits before it is
	// resolved (see reconcile.Config.Grace). Defaults to [GraceDefault].
	Grace time.Duration
	// BatchSize is the most rows one statement reclaims, and so the most
	// lookups run at once. Defaults to [BatchSizeDefault].
	BatchSize int
	// StalePending is how long a pending row may stay due before it is
	// counted and logged as stale. Defaults to [StalePendingDefault].
	StalePending time.Duration
	// ProgressFunc, when set, is called after every batch of resolved rows
	// with the report so far.
	ProgressFunc func(Report)
	// PruneFunc, when set, applies retention at the end of every run, after
	// the counts; nil leaves retention alone.
	PruneFunc func(ctx context.Context) (Pruned, error)
	// Logger receives the engine's logs. Required.
	Logger *slog.Logger

	// Runner is the client's attempt runner: its tools, store, settling
	// and recording, and the client's lease, statement timeout and clock.
	// Required.
	Runner *attempt.Runner
	// ToolsFunc returns the names of the tools the client registers, read
	// at every run: a registry may gain tools after the engine is made.
	// Only their expired rows are reclaimed. Required.
	ToolsFunc func() []string
	// WorkerID is the client's worker id. The engine's leases carry it
	// after "reconcile:" and before a random suffix of its own.
	WorkerID string
}

// withDefaults fills in the zero settings.
func (c Config) withDefaults() Config {
	c.Grace = cmp.Or(c.Grace, GraceDefault)
	c.BatchSize = cmp.Or(c.BatchSize, BatchSizeDefault)
	c.StalePending = cmp.Or(c.StalePending, StalePendingDefault)
	return c
}

// validate checks the settings a user chose, for an error naming the field,
// and panics on missing wiring, which no user input can cause.
func (c Config) validate() error {
	if c.Runner == nil || c.ToolsFunc == nil || c.Logger == nil {
		panic("reconciler: Config needs a Runner, a ToolsFunc and a Logger")
	}
	switch {
	case c.Grace < 0:
		return fmt.Errorf("%w: Grace must not be negative", ErrInvalidConfig)
	case c.BatchSize < 1 || c.BatchSize > BatchSizeMax:
		return fmt.Errorf("%w: BatchSize must be between 1 and %d", ErrInvalidConfig, BatchSizeMax)
	case c.StalePending < 0:
		return fmt.Errorf("%w: StalePending must not be negative", ErrInvalidConfig)
	}
	return nil
}
