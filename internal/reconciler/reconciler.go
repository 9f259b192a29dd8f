// Package reconciler is the reconcile engine that package reconcile and the
// dispatcher's maintenance both run: it reclaims in-flight rows whose lease
// expired, resolves each by its delivery mode without calling a provider,
// counts what it skipped and what waits too long, and applies retention
// through a hook.
package reconciler

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pgonce/pgonce/internal/attempt"
	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/observe"
	"github.com/pgonce/pgonce/internal/store"
)

// Engine resolves in-flight rows whose lease expired: a worker crashed, or
// an attempt ended ambiguously with nobody left to record it. It is safe for
// concurrent use.
type Engine struct {
	attempts *attempt.Runner
	store    *store.Store
	config   Config
	workerID string
}

// New returns an engine with config, its zero settings filled in. It
// returns an error matching [ErrInvalidConfig] for invalid settings.
func New(config Config) (*Engine, error) {
	config = config.withDefaults()
	if err := config.validate(); err != nil {
		return nil, err
	}
	return &Engine{
		attempts: config.Runner,
		store:    config.Runner.Store(),
		config:   config,
		workerID: ident.WorkerID("reconcile:" + config.WorkerID),
	}, nil
}

// RunOnce resolves every in-flight row of the registered tools whose lease
// expired more than [Config.Grace] ago, counts the expired rows of other
// tools and the stale pending rows, applies retention through
// [Config.PruneFunc] when set, and returns what it did, under the client's
// telemetry span of a reconcile run. Package reconcile documents the
// resolution by delivery mode.
func (e *Engine) RunOnce(ctx context.Context) (Report, error) {
	obs := e.attempts.Observer()
	if obs == nil {
		return e.runOnce(ctx)
	}
	ctx, end := obs.StartReconcile(ctx)
	report, err := e.runOnce(ctx)
	done := &observe.Reconciled{Err: err}
	for _, n := range report.Examined {
		done.Examined += n
	}
	for tool, kinds := range report.Resolved {
		for kind, n := range kinds {
			done.Resolutions = append(done.Resolutions, observe.Resolution{Tool: tool, Kind: string(kind), Count: n})
		}
	}
	end(done)
	return report, err
}

func (e *Engine) runOnce(ctx context.Context) (Report, error) {
	report := newReport()
	logger := e.config.Logger
	tools := e.config.ToolsFunc()
	for {
		var rows []*store.ClaimedKey
		claimedAt := time.Now()
		err := e.statement(ctx, func(ctx context.Context) error {
			var err error
			rows, err = e.store.ReclaimExpired(ctx, &store.ReclaimExpiredParams{
				Grace:  e.config.Grace,
				Tools:  tools,
				Max:    e.config.BatchSize,
				Lease:  e.attempts.Lease(),
				Worker: e.workerID,
				Now:    e.attempts.NowParam(),
			})
			return err
		})
		if err != nil {
			return report, fmt.Errorf("reclaim expired rows: %w", err)
		}
		if len(rows) == 0 {
			break
		}
		outcomes := make([]attempt.Outcome, len(rows))
		labels := make([]Outcome, len(rows))
		var resolving sync.WaitGroup
		for i, row := range rows {
			resolving.Go(func() { outcomes[i], labels[i] = e.resolve(ctx, row, claimedAt) })
		}
		resolving.Wait()
		tools := make(map[string]string, len(rows))
		for i, row := range rows {
			report.Examined[row.Tool]++
			report.count(row.Tool, labels[i])
			tools[outcomes[i].Key] = row.Tool
		}
		// Record logs what an operator must act on (review, failure) to
		// the engine's logger; requeues are logged here, at debug.
		written, err := e.attempts.Record(attempt.WithLogger(ctx, logger), outcomes)
		if err != nil {
			return report, err
		}
		for _, out := range outcomes {
			if !written[out.Key] {
				report.count(tools[out.Key], OutcomeSuperseded)
			} else if out.Kind == attempt.Retry {
				logger.DebugContext(ctx, "pgonce: reconciler requeued a key whose lease expired",
					"key", out.Key, "tool", out.Tool, "attempt", out.Attempt, "error", out.Err)
			}
		}
		if e.config.ProgressFunc != nil {
			e.config.ProgressFunc(report)
		}
		if len(rows) < e.config.BatchSize {
			break
		}
	}

	err := e.statement(ctx, func(ctx context.Context) error {
		skipped, err := e.store.CountExpired(ctx, &store.CountExpiredParams{Grace: e.config.Grace, Tools: tools, Now: e.attempts.NowParam()})
		if err != nil {
			return fmt.Errorf("count skipped rows: %w", err)
		}
		for _, row := range skipped {
			report.SkippedUnregistered[row.Tool] = int(row.Count)
		}
		return nil
	})
	if err != nil {
		return report, err
	}
	err = e.statement(ctx, func(ctx context.Context) error {
		stale, err := e.store.CountStalePending(ctx, e.config.StalePending, e.attempts.NowParam())
		if err != nil {
			return fmt.Errorf("count stale pending rows: %w", err)
		}
		report.StalePending = int(stale.Count)
		report.OldestStalePending = stale.OldestAge
		return nil
	})
	if err != nil {
		return report, err
	}
	if e.config.PruneFunc != nil {
		report.Pruned, err = e.config.PruneFunc(ctx)
		if err != nil {
			return report, err
		}
	}
	if report.StalePending > 0 {
		logger.WarnContext(ctx, "pgonce: pending rows nobody picks up; is a dispatcher running?",
			"stale_pending", report.StalePending, "oldest", report.OldestStalePending)
	}
	return report, nil
}

// statement runs f, one statement, on a pool connection under
// the client's statement timeout: a statement that hangs (a connection whose
// server vanished) is cancelled and its connection dropped, and the next
// run takes another.
func (e *Engine) statement(ctx context.Context, f func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, e.attempts.StatementTimeout())
	defer cancel()
	return f(ctx)
}

// resolve decides one expired row without calling its provider.
// claimedAt is the local clock just before the row was reclaimed.
//
// The row's delivery mode and provider key retention are the ones stored
// with the key at submit, not the registration's: an engine whose client
// registers a tool without them (the CLI's placeholders) still resolves its
// rows as their submitter's tool would. A row stored as a lookup tool whose
// registration here cannot look up goes back to pending with the next
// attempt looking up first, for a process that registers its provider.
func (e *Engine) resolve(ctx context.Context, row *store.ClaimedKey, claimedAt time.Time) (attempt.Outcome, Outcome) {
	registered := e.attempts.Tool(row.Tool)
	if registered == nil {
		// Only registered tools are reclaimed, and a registry never drops
		// one; a lookup keeps the row safe all the same.
		registered = &attempt.Tool{Name: row.Tool}
	}
	tool := *registered
	tool.Delivery = row.Delivery
	tool.KeyRetention = row.KeyRetention
	// Recording is tried again after transient failures, but never past
	// the engine's own lease.
	a := e.attempts.Claimed(row, claimedAt, 0)
	a.Tool, a.Ambiguous = &tool, true
	out := e.attempts.NewOutcome(a)
	out.Kind, out.Ambiguous = attempt.Retry, true
	out.Err = errors.New(attempt.LeaseExpiredReason)
	if tool.Delivery == store.DeliveryByLookup && tool.Lookup == nil {
		out.Err = errors.New("lease expired: the tool looks up by natural id, and no provider here can")
		return out, OutcomeLookupFailed
	}
	switch how, resp, err := e.attempts.Settle(ctx, a); how {
	case attempt.SettleReview:
		out.Kind = attempt.NeedsReview
		return out, OutcomeNeedsReview
	case attempt.SettleFound:
		out.Kind, out.Response, out.Ambiguous = attempt.Succeeded, resp, false
		return out, OutcomeFound
	case attempt.SettleLookupFailed:
		out.Err = err
		return out, OutcomeLookupFailed
	case attempt.SettleFailed:
		out.Kind, out.Failure, out.Err, out.Ambiguous = attempt.Failed, resp, err, false
		return out, OutcomeFailed
	case attempt.SettleNotFound:
		out.Ambiguous = false
		return out, OutcomeRequeued
	default: // attempt.SettleByKey
		return out, OutcomeRequeued
	}
}
