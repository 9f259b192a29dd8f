package dispatcher

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"time"

	"github.com/pgonce/pgonce/internal/attempt"
	"github.com/pgonce/pgonce/internal/observe"
	"github.com/pgonce/pgonce/internal/reconciler"
	"github.com/pgonce/pgonce/outbox"
)

// leaderTTLIntervals is how many maintenance intervals a leadership lasts
// without renewal: a renewal that fails once (a slow statement, a dropped
// connection) does not hand leadership over.
const leaderTTLIntervals = 3

// maintenanceLeadership names the leadership of the dispatchers that serve
// tools: dispatchers of the same tools elect one leader among themselves,
// and dispatchers of other tools in the same schema elect their own, so
// every served tool's expired leases are reconciled.
func maintenanceLeadership(tools []string) string {
	sorted := slices.Sorted(slices.Values(tools))
	sum := sha256.Sum256([]byte(strings.Join(sorted, "\x00")))
	return "maintenance:" + hex.EncodeToString(sum[:16])
}

// newReconciler returns the reconcile engine that maintenance runs over
// client, whose runner is attempts, with config's settings: the engine that
// package reconcile runs too, so that both resolve, count and prune alike.
func newReconciler[TTx any](client *outbox.Client[TTx], attempts *attempt.Runner, config ReconcileConfig) (*reconciler.Engine, error) {
	clientConfig := client.Config()
	engineConfig := reconciler.Config{
		Grace:        config.Grace,
		BatchSize:    config.BatchSize,
		StalePending: config.StalePending,
		Logger:       config.Logger,
		Runner:       attempts,
		ToolsFunc:    clientConfig.Registry.Names,
		WorkerID:     clientConfig.WorkerID,
	}
	if !config.PruneDisabled {
		engineConfig.PruneFunc = func(ctx context.Context) (reconciler.Pruned, error) {
			res, err := client.Prune(ctx, nil)
			return reconciler.Pruned{Keys: res.Keys, Tombstones: res.Tombstones}, err
		}
	}
	return reconciler.New(engineConfig)
}

// maintain runs maintenance while this dispatcher is elected, until ctx is
// done: every MaintenanceInterval it asks to be elected (or renews its
// leadership) and, while it leads, runs the reconciler once. It resigns
// when ctx is done, so that another dispatcher takes over at its next
// attempt.
func (d *Dispatcher[TTx]) maintain(ctx context.Context, engine *reconciler.Engine) {
	tools := d.registry.Names()
	if len(tools) == 0 {
		return
	}
	name := maintenanceLeadership(tools)
	// The worker id carries a random suffix: two dispatchers of one process
	// are two candidates.
	id := d.workerID
	interval := d.config.MaintenanceInterval
	ttl := leaderTTLIntervals * interval
	leading := false
	obs := d.attempts.Observer()
	defer func() {
		if !leading {
			return
		}
		if obs != nil {
			obs.Gauged(ctx, d.client.Config().Schema, nil)
		}
		resignCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.client.Config().StatementTimeout)
		defer cancel()
		if _, err := d.store.LeaderResign(resignCtx, name, id); err != nil {
			d.logger.WarnContext(resignCtx, "pgonce: resigning maintenance leadership failed; another dispatcher takes over when it expires",
				"error", err, "expires_in", ttl)
		}
	}()
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		elected, err := d.elect(ctx, name, id, ttl)
		switch {
		case err != nil && ctx.Err() == nil:
			d.logger.ErrorContext(ctx, "pgonce: maintenance election failed", "error", err)
		case elected && !leading:
			d.logger.InfoContext(ctx, "pgonce: elected to run maintenance (reconcile and prune)", "leader_id", id)
		case !elected && leading && ctx.Err() == nil:
			d.logger.InfoContext(ctx, "pgonce: maintenance leadership lost", "leader_id", id)
		}
		if !elected && leading && obs != nil {
			obs.Gauged(ctx, d.client.Config().Schema, nil)
		}
		leading = elected
		if leading {
			if _, err := engine.RunOnce(ctx); err != nil && ctx.Err() == nil {
				d.logger.ErrorContext(ctx, "pgonce: maintenance reconcile failed", "error", err)
			}
			if obs != nil {
				d.gauge(ctx, obs, tools, ttl)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

func (d *Dispatcher[TTx]) elect(ctx context.Context, name, id string, ttl time.Duration) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, d.client.Config().StatementTimeout)
	defer cancel()
	return d.store.LeaderElect(ctx, name, id, ttl, nil)
}

// gauge reads the state of the keys of tools and tells obs, for the leader's
// ttl: only the elected dispatcher reads it, once per maintenance interval.
func (d *Dispatcher[TTx]) gauge(ctx context.Context, obs observe.Observer, tools []string, ttl time.Duration) {
	statsCtx, cancel := context.WithTimeout(ctx, d.client.Config().StatementTimeout)
	defer cancel()
	until := time.Now().Add(ttl)
	stats, err := d.client.Stats(statsCtx)
	if err != nil {
		if ctx.Err() == nil {
			d.logger.WarnContext(ctx, "pgonce: reading key stats for telemetry failed", "error", err)
		}
		return
	}
	controls, err := d.client.Tools(statsCtx)
	if err != nil {
		if ctx.Err() == nil {
			d.logger.WarnContext(ctx, "pgonce: reading tool flow control for telemetry failed", "error", err)
		}
		return
	}
	paused := make(map[string]bool, len(controls))
	for _, c := range controls {
		paused[c.Tool] = c.Paused
	}
	gauges := &observe.Gauges{Until: until, Tools: make([]observe.ToolGauges, 0, len(tools))}
	for _, tool := range tools {
		g := toolGauges(stats, tool)
		g.Paused = paused[tool]
		gauges.Tools = append(gauges.Tools, g)
	}
	obs.Gauged(ctx, d.client.Config().Schema, gauges)
}

// toolGauges is tool's part of stats.
func toolGauges(stats outbox.Stats, tool string) observe.ToolGauges {
	keys := stats.Keys[tool]
	return observe.ToolGauges{
		Tool:          tool,
		Pending:       keys[outbox.StatePending],
		InFlight:      keys[outbox.StateInFlight],
		NeedsReview:   keys[outbox.StateNeedsReview],
		OldestPending: stats.OldestPendingByTool[tool],
	}
}
