package dispatcher

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/pgonce/pgonce/outbox"
)

// Defaults of [Config].
const (
	ConcurrencyDefault     = 100
	ConcurrencyMax         = 100_000
	BatchSizeDefault       = 100
	PollIntervalDefault    = time.Second
	MaxAttemptsDefault     = 25
	BackoffMinDefault      = time.Second
	BackoffMaxDefault      = 10 * time.Minute
	ShutdownTimeoutDefault = 30 * time.Second
	UnservedAfterDefault   = time.Hour
	// MaintenanceIntervalDefault is how often the elected dispatcher
	// reconciles and prunes.
	MaintenanceIntervalDefault = 30 * time.Second
)

// MaintenanceIntervalDevelopment is the development preset's
// [Config.MaintenanceInterval] (see outbox.CallTimeoutDevelopment). With
// the preset, a key left in flight by a crashed worker is resolved within
// max(Lease + Grace, 3 × MaintenanceInterval) + MaintenanceInterval of the
// crash, 5s, if a dispatcher runs by then; with the defaults, within 2
// minutes.
const MaintenanceIntervalDevelopment = time.Second

// ErrInvalidConfig is returned by [New] for an invalid [Config].
var ErrInvalidConfig = errors.New("invalid dispatcher config")

// Config configures a [Dispatcher]. Its zero value works: every field has a
// default. The lease a claim holds and the deadline of each provider call
// are the client's ([outbox.Config.Lease], [outbox.Config.CallTimeout]), as
// for [outbox.Client.Do] and the reconciler.
type Config struct {
	// Concurrency is how many provider calls run at once, at most
	// [ConcurrencyMax]. Defaults to [ConcurrencyDefault], 100: a slot is
	// held from the claim until the outcome is recorded, so the rate a
	// dispatcher reaches is about Concurrency divided by a call's time plus
	// that round trip (100 slots: ~1,000 calls/s of 100 ms calls, and for
	// cheap calls about four fifths of a tuned dispatcher's rate). Lower it
	// for a provider that limits how many requests it takes at once; raise
	// it for slow providers, or cheap ones on a large server.
	Concurrency int

	// BatchSize is the most rows one claim takes. A claim never takes more
	// rows than there are free call slots. Defaults to [BatchSizeDefault].
	BatchSize int

	// PollInterval is how often the dispatcher looks for due rows when no
	// notification wakes it: rows whose backoff elapsed, and work whose
	// notification was lost. Over a pool too small to listen and claim at
	// once (see [Dispatcher.Run]) it is how soon new work is seen. Defaults
	// to [PollIntervalDefault].
	PollInterval time.Duration

	// MaxAttempts is the attempt after which a retryable failure becomes
	// final: the key fails with the last error stored. Defaults to
	// [MaxAttemptsDefault].
	MaxAttempts int

	// BackoffMin and BackoffMax bound the delay before a retry. The delay
	// doubles with every attempt from BackoffMin, is capped at BackoffMax,
	// and is jittered to between half and all of that. Default to
	// [BackoffMinDefault] and [BackoffMaxDefault].
	BackoffMin time.Duration
	BackoffMax time.Duration

	// BackoffFunc, when set, replaces the policy above: it returns the delay
	// before the retry that follows attempt (from 1).
	BackoffFunc func(attempt int) time.Duration

	// ShutdownTimeout is how long Run lets calls in flight finish once its
	// context is done. Calls still running then are cancelled and their rows
	// stay in flight until their lease expires and the reconciler resolves
	// them. -1 cancels them at once. Defaults to [ShutdownTimeoutDefault].
	ShutdownTimeout time.Duration

	// UnservedAfter is how long a pending row of a tool that this process
	// does not serve may wait before it is reported (logged as a warning):
	// work that no process serves. -1 disables the report. Defaults to
	// [UnservedAfterDefault].
	UnservedAfter time.Duration

	// MaintenanceDisabled turns off in-process maintenance. By default, the
	// dispatchers that serve the same tools in one schema elect one of
	// themselves, which every [Config.MaintenanceInterval] runs a reconciler
	// over the dispatcher's client (as reconcile.Reconciler.RunOnce does:
	// expired leases of those tools resolved, retention pruned unless
	// [ReconcileConfig.PruneDisabled]), so that a service that runs
	// dispatchers alone is never left with keys in flight after a crash.
	// Disable it for services that run `pgonce reconcile --once` or their
	// own reconciler on a schedule; both running at once is safe, only
	// redundant. Defaults to false.
	MaintenanceDisabled bool

	// MaintenanceInterval is how often the elected dispatcher runs
	// maintenance, and how often the others ask to be elected. The leader
	// holds its leadership for three intervals and renews it every interval,
	// so a crashed leader is replaced within three intervals; one that stops
	// hands leadership over at once. It is also how often the dispatcher
	// reads which tools have flow control when no notification tells it:
	// the bound on how late a pause or limit of a tool that had none
	// reaches a dispatcher that hears no notification (docs/flow-control.md,
	// "How soon a change reaches the dispatchers"). Defaults to
	// [MaintenanceIntervalDefault]; the development preset sets
	// [MaintenanceIntervalDevelopment].
	MaintenanceInterval time.Duration

	// Reconcile configures the reconciler that maintenance runs. Its zero
	// value works.
	Reconcile ReconcileConfig

	// Logger receives the dispatcher's logs. Defaults to the client's
	// ([outbox.Config.Logger]), which passes on only warnings and errors
	// unless the client was given a Logger.
	Logger *slog.Logger
}

// ReconcileConfig configures the reconciler that a dispatcher's maintenance
// runs (see [Config.MaintenanceDisabled]): the settings of package
// reconcile's Config that apply to it, with the same defaults and rules. Its
// zero value works. An invalid one makes [New] return an error matching both
// [ErrInvalidConfig] and reconcile.ErrInvalidConfig.
type ReconcileConfig struct {
	// Grace is how long past its lease an in-flight row waits before it is
	// resolved. It must exceed the longest time a request of a dead worker
	// can still be travelling to a provider (see reconcile.Config.Grace).
	// Defaults to 30s, reconcile.GraceDefault; the development preset sets
	// reconcile.GraceDevelopment, 1s.
	Grace time.Duration

	// BatchSize is the most expired rows one statement takes, and so the
	// most lookups run at once, at most 1000; a run repeats until no
	// expired row is left. Defaults to 32, reconcile.BatchSizeDefault.
	BatchSize int

	// StalePending is how long a pending row may stay due before
	// maintenance logs it as a warning: pending rows nobody picks up. They
	// are never touched. Defaults to 10 minutes,
	// reconcile.StalePendingDefault.
	StalePending time.Duration

	// PruneDisabled turns off retention in maintenance. By default every
	// run also prunes finished keys past their retention into tombstones,
	// and tombstones past their horizon (see [outbox.Client.Prune]).
	PruneDisabled bool

	// Logger receives the maintenance reconciler's logs. Defaults to the
	// dispatcher's ([Config.Logger]).
	Logger *slog.Logger
}

func (c Config) withDefaults(client outbox.Config) Config {
	c.Concurrency = cmp.Or(c.Concurrency, ConcurrencyDefault)
	c.BatchSize = cmp.Or(c.BatchSize, BatchSizeDefault)
	c.PollInterval = cmp.Or(c.PollInterval, PollIntervalDefault)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, MaxAttemptsDefault)
	c.BackoffMin = cmp.Or(c.BackoffMin, BackoffMinDefault)
	c.BackoffMax = cmp.Or(c.BackoffMax, BackoffMaxDefault)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, ShutdownTimeoutDefault)
	c.UnservedAfter = cmp.Or(c.UnservedAfter, UnservedAfterDefault)
	c.Logger = cmp.Or(c.Logger, client.Logger)
	c.MaintenanceInterval = cmp.Or(c.MaintenanceInterval, MaintenanceIntervalDefault)
	c.Reconcile.Logger = cmp.Or(c.Reconcile.Logger, c.Logger)
	return c
}

func (c Config) validate() error {
	switch {
	case c.Concurrency < 1 || c.Concurrency > ConcurrencyMax:
		return fmt.Errorf("%w: Concurrency must be between 1 and %d", ErrInvalidConfig, ConcurrencyMax)
	case c.BatchSize < 1 || c.BatchSize > 10_000:
		return fmt.Errorf("%w: BatchSize must be between 1 and 10000", ErrInvalidConfig)
	case c.PollInterval < time.Millisecond:
		return fmt.Errorf("%w: PollInterval must be at least 1ms", ErrInvalidConfig)
	case c.MaxAttempts < 1:
		return fmt.Errorf("%w: MaxAttempts must be at least 1", ErrInvalidConfig)
	case c.BackoffMin < 0 || c.BackoffMax < c.BackoffMin:
		return fmt.Errorf("%w: BackoffMin must not be negative nor above BackoffMax", ErrInvalidConfig)
	case c.ShutdownTimeout < -1:
		return fmt.Errorf("%w: ShutdownTimeout must not be negative, or -1 to cancel calls at once", ErrInvalidConfig)
	case c.UnservedAfter < -1:
		return fmt.Errorf("%w: UnservedAfter must be positive, or -1 to disable", ErrInvalidConfig)
	case c.MaintenanceInterval < 10*time.Millisecond:
		return fmt.Errorf("%w: MaintenanceInterval must be at least 10ms", ErrInvalidConfig)
	}
	return nil
}
