package reconcile

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/pgonce/pgonce/internal/attempt"
	"github.com/pgonce/pgonce/internal/reconciler"
	"github.com/pgonce/pgonce/outbox"
)

// Defaults of [Config].
const (
	GraceDefault        = 30 * time.Second
	BatchSizeDefault    = 32
	StalePendingDefault = 10 * time.Minute
)

// GraceDevelopment is the development preset's [Config.Grace] (see
// outbox.CallTimeoutDevelopment): enough for a request of a dead worker on
// the same machine to have arrived, far too little across a network.
const GraceDevelopment = time.Second

// ErrInvalidConfig is returned by [New] for an invalid [Config].
var ErrInvalidConfig = reconciler.ErrInvalidConfig

// Config configures a [Reconciler]. Its zero value works.
type Config struct {
	// Grace is how long past its lease an in-flight row waits before it is
	// resolved. It must exceed the longest time a request of a dead worker
	// can still be travelling to a provider: after a natural-id lookup finds
	// nothing, the next attempt calls the provider again, and a request
	// still in transit could then act too. Defaults to [GraceDefault]; the
	// development preset sets [GraceDevelopment].
	Grace time.Duration

	// BatchSize is the most rows one statement takes. The rows of a batch
	// are resolved at once, each lookup under the client's CallTimeout,
	// which is shorter than the lease the batch is taken under: a batch
	// never outlives its lease, however slow the lookups. It is therefore
	// also the most lookups run at once. RunOnce repeats until no expired
	// row is left. Defaults to [BatchSizeDefault].
	BatchSize int

	// StalePending is how long a pending row may stay due before it is
	// reported as stale (a dead dispatcher is a finding). Stale rows are
	// reported, never touched. Defaults to [StalePendingDefault].
	StalePending time.Duration

	// PruneDisabled turns off retention in [Reconciler.RunOnce]. By default
	// every run also prunes finished keys past their retention into
	// tombstones, and tombstones past their horizon (see
	// [outbox.Client.Prune]).
	PruneDisabled bool

	// ProgressFunc, when set, is called after every batch of resolved rows
	// with the report so far, for progress displays.
	ProgressFunc func(Report)

	// Logger receives the reconciler's logs. Defaults to the client's.
	Logger *slog.Logger
}

// Reconciler resolves in-flight rows whose lease expired: a worker crashed,
// or an attempt ended ambiguously with nobody left to record it.
type Reconciler[TTx any] struct {
	engine *reconciler.Engine
	logger *slog.Logger
}

// New returns a reconciler for the tools in client's registry. It returns
// [ErrInvalidConfig] for an invalid config or a client not made by
// [outbox.New] or [outbox.NewPgx].
func New[TTx any](client *outbox.Client[TTx], config Config) (*Reconciler[TTx], error) {
	if client == nil {
		return nil, fmt.Errorf("%w: client must not be nil", ErrInvalidConfig)
	}
	runner, err := attempt.Of(client)
	if err != nil {
		return nil, fmt.Errorf("%w: client: %w", ErrInvalidConfig, err)
	}
	clientConfig := client.Config()
	logger := cmp.Or(config.Logger, clientConfig.Logger)
	engineConfig := reconciler.Config{
		Grace:        config.Grace,
		BatchSize:    config.BatchSize,
		StalePending: config.StalePending,
		Logger:       logger,
		Runner:       runner,
		ToolsFunc:    clientConfig.Registry.Names,
		WorkerID:     clientConfig.WorkerID,
	}
	if progress := config.ProgressFunc; progress != nil {
		engineConfig.ProgressFunc = func(report reconciler.Report) { progress(reportOf(report)) }
	}
	if !config.PruneDisabled {
		engineConfig.PruneFunc = func(ctx context.Context) (reconciler.Pruned, error) {
			res, err := client.Prune(ctx, nil)
			return reconciler.Pruned{Keys: res.Keys, Tombstones: res.Tombstones}, err
		}
	}
	engine, err := reconciler.New(engineConfig)
	if err != nil {
		return nil, err
	}
	return &Reconciler[TTx]{engine: engine, logger: logger}, nil
}

// Outcome names what the reconciler did with a row, as counted in a [Report].
// Its values, the keys of Report.Resolved's outcomes in JSON, are
// "requeued", "found", "needs_review", "lookup_failed", "superseded" and
// "failed".
type Outcome = reconciler.Outcome

// Outcomes counted in a [Report].
const (
	// OutcomeRequeued: back to pending; the key is presented again.
	OutcomeRequeued Outcome = reconciler.OutcomeRequeued
	// OutcomeFound: a lookup found the effect; its response is recorded.
	OutcomeFound Outcome = reconciler.OutcomeFound
	// OutcomeNeedsReview: the outcome cannot be made certain.
	OutcomeNeedsReview Outcome = reconciler.OutcomeNeedsReview
	// OutcomeLookupFailed: the lookup failed; the row is pending again and
	// its next attempt looks up first.
	OutcomeLookupFailed Outcome = reconciler.OutcomeLookupFailed
	// OutcomeSuperseded: someone else recorded the row first.
	OutcomeSuperseded Outcome = reconciler.OutcomeSuperseded
	// OutcomeFailed: a lookup found that the action failed for good (it
	// returned an [outbox.Permanent] or [outbox.PermanentBody] error); the
	// key fails with that failure.
	OutcomeFailed Outcome = reconciler.OutcomeFailed
)

// Report counts what one [Reconciler.RunOnce] examined and did. It is
// JSON-ready.
type Report struct {
	// Examined counts the expired rows taken, per tool.
	Examined map[string]int `json:"examined"`
	// Resolved counts, per tool and outcome, what was done with them.
	Resolved map[string]map[Outcome]int `json:"resolved"`
	// SkippedUnregistered counts expired rows of tools this process does not
	// register, per tool. They are left alone.
	SkippedUnregistered map[string]int `json:"skipped_unregistered"`
	// StalePending counts pending rows due for longer than
	// [Config.StalePending]: no dispatcher is picking them up.
	StalePending int `json:"stale_pending"`
	// OldestStalePending is how long the oldest of them has been due.
	OldestStalePending time.Duration `json:"oldest_stale_pending_ns"`
	// Pruned counts what retention removed.
	Pruned outbox.PruneResult `json:"pruned"`
}

// reportOf is the engine's report as a [Report]; it shares its maps.
func reportOf(r reconciler.Report) Report {
	return Report{
		Examined:            r.Examined,
		Resolved:            r.Resolved,
		SkippedUnregistered: r.SkippedUnregistered,
		StalePending:        r.StalePending,
		OldestStalePending:  r.OldestStalePending,
		Pruned:              outbox.PruneResult{Keys: r.Pruned.Keys, Tombstones: r.Pruned.Tombstones},
	}
}

// RunOnce resolves every in-flight row whose lease expired more than
// [Config.Grace] ago, by its tool's delivery mode, applies retention unless
// [Config.PruneDisabled], and returns what it did.
// It is meant for a scheduled job, and is safe to run concurrently with
// dispatchers and other reconcilers: each row is taken by one of them, and a
// live lease is never touched.
//
//   - [outbox.IdempotentByKey]: back to pending; the key is presented again
//     and the provider deduplicates. Past the provider's key retention the
//     row is looked up when the provider can, and sent to review otherwise.
//   - [outbox.LookupByNaturalID]: read before write. Found: the found
//     response is recorded as succeeded. Not found: back to pending. Lookup
//     error: back to pending with the next attempt looking up first.
//   - [outbox.AtMostOnce]: needs review; never retried automatically.
func (r *Reconciler[TTx]) RunOnce(ctx context.Context) (Report, error) {
	report, err := r.engine.RunOnce(ctx)
	return reportOf(report), err
}

// Run calls [Reconciler.RunOnce] every interval until ctx is done, logging
// errors and going on. It returns ctx's error.
func (r *Reconciler[TTx]) Run(ctx context.Context, every time.Duration) error {
	if every <= 0 {
		return fmt.Errorf("%w: every must be positive", ErrInvalidConfig)
	}
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		if _, err := r.RunOnce(ctx); err != nil && ctx.Err() == nil {
			r.logger.ErrorContext(ctx, "pgonce: reconcile failed", "error", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ticker.C:
		}
	}
}
