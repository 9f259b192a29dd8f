package reconcile

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/pgonce/pgonce/internal/attempt"
	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/observe"
	"github.com/pgonce/pgonce/internal/store"
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
var ErrInvalidConfig = errors.New("invalid reconcile config")

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
	client   *outbox.Client[TTx]
	attempts *attempt.Runner
	store    *store.Store
	registry *outbox.Registry
	config   Config
	logger   *slog.Logger
	workerID string
}

// New returns a reconciler for the tools in client's registry.
func New[TTx any](client *outbox.Client[TTx], config Config) (*Reconciler[TTx], error) {
	if client == nil {
		return nil, fmt.Errorf("%w: client must not be nil", ErrInvalidConfig)
	}
	clientConfig := client.Config()
	config.Grace = cmp.Or(config.Grace, GraceDefault)
	config.BatchSize = cmp.Or(config.BatchSize, BatchSizeDefault)
	config.StalePending = cmp.Or(config.StalePending, StalePendingDefault)
	config.Logger = cmp.Or(config.Logger, clientConfig.Logger)
	switch {
	case config.Grace < 0:
		return nil, fmt.Errorf("%w: Grace must not be negative", ErrInvalidConfig)
	case config.BatchSize < 1 || config.BatchSize > 1000:
		return nil, fmt.Errorf("%w: BatchSize must be between 1 and 1000", ErrInvalidConfig)
	case config.StalePending < 0:
		return nil, fmt.Errorf("%w: StalePending must not be negative", ErrInvalidConfig)
	}
	attempts := attempt.Of(client)
	return &Reconciler[TTx]{
		client:   client,
		attempts: attempts,
		store:    attempts.Store(),
		registry: clientConfig.Registry,
		config:   config,
		logger:   config.Logger,
		workerID: ident.WorkerID("reconcile:" + clientConfig.WorkerID),
	}, nil
}

// Outcome names what the reconciler did with a row, as counted in a [Report].
type Outcome string

// Outcomes counted in a [Report].
const (
	// OutcomeRequeued: back to pending; the key is presented again.
	OutcomeRequeued Outcome = "requeued"
	// OutcomeFound: a lookup found the effect; its response is recorded.
	OutcomeFound Outcome = "found"
	// OutcomeNeedsReview: the outcome cannot be made certain.
	OutcomeNeedsReview Outcome = "needs_review"
	// OutcomeLookupFailed: the lookup failed; the row is pending again and
	// its next attempt looks up first.
	OutcomeLookupFailed Outcome = "lookup_failed"
	// OutcomeSuperseded: someone else recorded the row first.
	OutcomeSuperseded Outcome = "superseded"
	// OutcomeFailed: a lookup found that the action failed for good (it
	// returned an [outbox.Permanent] or [outbox.PermanentBody] error); the
	// key fails with that failure.
	OutcomeFailed Outcome = "failed"
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

func newReport() Report {
	return Report{
		Examined:            map[string]int{},
		Resolved:            map[string]map[Outcome]int{},
		SkippedUnregistered: map[string]int{},
	}
}

func (r *Report) count(tool string, outcome Outcome) {
	if r.Resolved[tool] == nil {
		r.Resolved[tool] = map[Outcome]int{}
	}
	r.Resolved[tool][outcome]++
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
	obs := r.attempts.Observer()
	if obs == nil {
		return r.runOnce(ctx)
	}
	ctx, end := obs.StartReconcile(ctx)
	report, err := r.runOnce(ctx)
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

// now is the client's clock as a statement parameter: nil, the database's
// clock, unless the client's Config.NowFunc is set, which leases then
// follow (as the client's and the dispatcher's statements do).
func (r *Reconciler[TTx]) now() *time.Time {
	if r.client.Config().NowFunc == nil {
		return nil
	}
	now := r.client.Now()
	return &now
}

func (r *Reconciler[TTx]) runOnce(ctx context.Context) (Report, error) {
	report := newReport()
	tools := r.registry.Names()
	for {
		var rows []*store.ClaimedKey
		claimedAt := time.Now()
		err := r.statement(ctx, func(ctx context.Context) error {
			var err error
			rows, err = r.store.ReclaimExpired(ctx, &store.ReclaimExpiredParams{
				Grace:  r.config.Grace,
				Tools:  tools,
				Max:    r.config.BatchSize,
				Lease:  r.client.Config().Lease,
				Worker: r.workerID,
				Now:    r.now(),
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
			resolving.Go(func() { outcomes[i], labels[i] = r.resolve(ctx, row, claimedAt) })
		}
		resolving.Wait()
		tools := make(map[string]string, len(rows))
		for i, row := range rows {
			report.Examined[row.Tool]++
			report.count(row.Tool, labels[i])
			tools[outcomes[i].Key] = row.Tool
		}
		// Record logs what an operator must act on (review, failure) to
		// the reconciler's logger; requeues are logged here, at debug.
		written, err := r.attempts.Record(attempt.WithLogger(ctx, r.logger), outcomes)
		if err != nil {
			return report, err
		}
		for _, out := range outcomes {
			if !written[out.Key] {
				report.count(tools[out.Key], OutcomeSuperseded)
			} else if out.Kind == attempt.Retry {
				r.logger.DebugContext(ctx, "pgonce: reconciler requeued a key whose lease expired",
					"key", out.Key, "tool", out.Tool, "attempt", out.Attempt, "error", out.Err)
			}
		}
		if r.config.ProgressFunc != nil {
			r.config.ProgressFunc(report)
		}
		if len(rows) < r.config.BatchSize {
			break
		}
	}

	err := r.statement(ctx, func(ctx context.Context) error {
		skipped, err := r.store.CountExpired(ctx, &store.CountExpiredParams{Grace: r.config.Grace, Tools: tools, Now: r.now()})
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
	err = r.statement(ctx, func(ctx context.Context) error {
		stale, err := r.store.CountStalePending(ctx, r.config.StalePending, r.now())
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
	if !r.config.PruneDisabled {
		report.Pruned, err = r.client.Prune(ctx, nil)
		if err != nil {
			return report, err
		}
	}
	if report.StalePending > 0 {
		r.logger.WarnContext(ctx, "pgonce: pending rows nobody picks up; is a dispatcher running?",
			"stale_pending", report.StalePending, "oldest", report.OldestStalePending)
	}
	return report, nil
}

// statement runs f, one statement, on a pool connection under the client's
// [outbox.Config.StatementTimeout]: a statement that hangs (a connection
// whose server vanished) is cancelled and its connection dropped, and the
// next run takes another.
func (r *Reconciler[TTx]) statement(ctx context.Context, f func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, r.client.Config().StatementTimeout)
	defer cancel()
	return f(ctx)
}

// resolve decides one expired row without calling its provider.
// claimedAt is the local clock just before the row was reclaimed.
//
// The row's delivery mode and provider key retention are the ones stored
// with the key at submit, not the registration's: a reconciler that
// registers a tool without them (the CLI's placeholders) still resolves its
// rows as their submitter's tool would. A row stored as a lookup tool whose
// registration here cannot look up goes back to pending with the next
// attempt looking up first, for a process that registers its provider.
func (r *Reconciler[TTx]) resolve(ctx context.Context, row *store.ClaimedKey, claimedAt time.Time) (attempt.Outcome, Outcome) {
	registered := r.attempts.Tool(row.Tool)
	if registered == nil {
		// Only registered tools are reclaimed, and a registry never drops
		// one; a lookup keeps the row safe all the same.
		registered = &attempt.Tool{Name: row.Tool}
	}
	tool := *registered
	tool.Delivery = row.Delivery
	tool.KeyRetention = row.KeyRetention
	// Recording is tried again after transient failures, but never past
	// the reconciler's own lease.
	a := r.attempts.Claimed(row, claimedAt, 0)
	a.Tool, a.Ambiguous = &tool, true
	out := r.attempts.NewOutcome(a)
	out.Kind, out.Ambiguous = attempt.Retry, true
	out.Err = errors.New(attempt.LeaseExpiredReason)
	if tool.Delivery == store.DeliveryByLookup && tool.Lookup == nil {
		out.Err = errors.New("lease expired: the tool looks up by natural id, and no provider here can")
		return out, OutcomeLookupFailed
	}
	switch how, resp, err := r.attempts.Settle(ctx, a); how {
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
