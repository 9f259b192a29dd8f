package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	mathrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgonce/pgonce/internal/attempt"
	"github.com/pgonce/pgonce/internal/ident"
	"github.com/pgonce/pgonce/internal/reconciler"
	"github.com/pgonce/pgonce/internal/store"
	"github.com/pgonce/pgonce/outbox"
)

// Dispatcher claims due pending keys and runs their providers. Any number of
// dispatchers, in any number of processes, may share one schema: claims use
// FOR UPDATE SKIP LOCKED, so no row is claimed twice, and every claim is
// committed before its provider is called.
type Dispatcher[TTx any] struct {
	client   *outbox.Client[TTx]
	attempts *attempt.Runner
	store    *store.Store
	registry *outbox.Registry
	config   Config
	logger   *slog.Logger
	workerID string
	// reconciler runs maintenance while this dispatcher is elected; nil
	// with [Config.MaintenanceDisabled].
	reconciler *reconciler.Engine
	// claimer claims due keys; it knows which tools have flow control.
	claimer *attempt.Claimer

	running sync.Mutex
}

// New returns a dispatcher for the tools in client's registry. It returns
// [ErrInvalidConfig] for an invalid config or a client not made by
// [outbox.New] or [outbox.NewPgx], and also
// [outbox.ErrTransactionPooling] for a client with
// [outbox.PoolingTransaction] whose dispatcher would listen through the
// pooler: give the client a ListenConnectFunc, or set NotifyDisabled.
func New[TTx any](client *outbox.Client[TTx], config Config) (*Dispatcher[TTx], error) {
	if client == nil {
		return nil, fmt.Errorf("%w: client must not be nil", ErrInvalidConfig)
	}
	clientConfig := client.Config()
	config = config.withDefaults(clientConfig)
	if err := config.validate(); err != nil {
		return nil, err
	}
	if clientConfig.Pooling == outbox.PoolingTransaction && clientConfig.ListenConnectFunc == nil && !clientConfig.NotifyDisabled {
		// A LISTEN through a transaction pooler hears nothing: the server
		// connection that ran it serves other clients' transactions.
		return nil, fmt.Errorf("%w: %w: a dispatcher over a client with PoolingTransaction cannot listen through the pooler: "+
			"set the client's ListenConnectFunc to a direct connection, or NotifyDisabled to poll only", ErrInvalidConfig, outbox.ErrTransactionPooling)
	}
	attempts, err := attempt.Of(client)
	if err != nil {
		return nil, fmt.Errorf("%w: client: %w", ErrInvalidConfig, err)
	}
	var engine *reconciler.Engine
	if !config.MaintenanceDisabled {
		var err error
		if engine, err = newReconciler(client, attempts, config.Reconcile); err != nil {
			return nil, fmt.Errorf("%w: Reconcile: %w", ErrInvalidConfig, err)
		}
	}
	workerID := ident.WorkerID(clientConfig.WorkerID)
	return &Dispatcher[TTx]{
		client:     client,
		attempts:   attempts,
		store:      attempts.Store(),
		registry:   clientConfig.Registry,
		config:     config,
		logger:     config.Logger,
		workerID:   workerID,
		reconciler: engine,
		claimer: attempts.NewClaimer(attempt.ClaimerConfig{
			Worker:      workerID,
			MaxAttempts: config.MaxAttempts,
			ReadEvery:   config.MaintenanceInterval,
			Observer:    attempts.Observer(),
		}),
	}, nil
}

// WorkerID is the id this dispatcher writes into the leases it holds.
func (d *Dispatcher[TTx]) WorkerID() string { return d.workerID }

// Run claims and runs due rows until ctx is done. It then stops claiming,
// lets calls in flight finish for up to [Config.ShutdownTimeout], records
// what finished, and returns nil. Rows whose calls did not finish stay in
// flight until their lease expires and the reconciler resolves them.
//
// Run listens for new work on a connection of its own, held while it runs,
// when the pool can spare one beside the connection its claims and records
// take one at a time; over a pool of one connection it logs a warning and
// polls every [Config.PollInterval] instead.
//
// Unless [Config.MaintenanceDisabled], Run also takes part in the election
// of the dispatcher that runs maintenance (see [Config.MaintenanceDisabled])
// and, while elected, reconciles and prunes every
// [Config.MaintenanceInterval]; it resigns when ctx is done.
//
// Database errors are logged and retried; Run returns an error only when it
// is already running.
func (d *Dispatcher[TTx]) Run(ctx context.Context) error {
	if !d.running.TryLock() {
		return errors.New("dispatcher is already running")
	}
	defer d.running.Unlock()

	r := &run{
		wake:       make(chan struct{}, 1),
		slots:      make(chan struct{}, d.config.Concurrency),
		work:       make(chan attempt.Attempt),
		outcomes:   make(chan pendingOutcome, d.config.Concurrency),
		claimRetry: claimRetryMin,
	}
	stopBackground := d.startBackground(ctx, r.signal)
	defer stopBackground()

	// Provider calls outlive ctx by up to ShutdownTimeout; hardStop ends
	// them after that.
	// Provider calls log (a panic, say) to the dispatcher's logger, as its
	// records do.
	r.callCtx, r.hardStop = context.WithCancel(attempt.WithLogger(context.WithoutCancel(ctx), d.logger))
	defer r.hardStop()

	recorded := make(chan struct{})
	go func() {
		defer close(recorded)
		d.record(r.outcomes)
	}()

	d.claimUntilDone(ctx, r)
	close(r.work)
	d.finishCalls(r)
	r.workers.Wait()
	close(r.outcomes)
	<-recorded
	return nil
}

// run is the state one [Dispatcher.Run] shares between its claim loop and
// the provider calls the loop starts.
type run struct {
	// wake is signalled when a slot frees or a notification arrives.
	wake chan struct{}
	// slots holds one token per provider call running or awaiting its
	// record; its capacity is Concurrency.
	slots chan struct{}
	// calls counts the provider calls running or awaiting their record.
	calls sync.WaitGroup
	// work hands a claimed attempt to an idle worker. Workers outlive
	// their calls, so that a call runs on a goroutine whose stack has
	// grown already instead of growing a new one's (a tenth of the
	// dispatcher's own CPU time when every call had a goroutine of its
	// own); there are never more of them than Concurrency. The claim loop
	// closes it when it stops.
	work    chan attempt.Attempt
	workers sync.WaitGroup
	// idle counts the workers waiting on work that no claim reserved.
	idle atomic.Int64
	// outcomes carries finished calls to the recorder.
	outcomes chan pendingOutcome
	// callCtx is the provider calls' context: it outlives Run's ctx until
	// hardStop, at the end of ShutdownTimeout.
	callCtx  context.Context
	hardStop context.CancelFunc
	// After a failed claim the next one comes sooner than PollInterval,
	// backing off from claimRetryMin: a database that is back (or a fresh
	// connection after a dead one) is used at once, not a poll later.
	claimRetry time.Duration
}

// signal wakes the claim loop, or does nothing when a wake-up is pending.
func (r *run) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// startBackground starts what runs beside the claim loop: the listener
// for new work and, unless disabled, maintenance. The returned func stops
// them and waits for them to end.
func (d *Dispatcher[TTx]) startBackground(ctx context.Context, signal func()) (stop func()) {
	var (
		background sync.WaitGroup
		trailing   *time.Timer
	)
	listenCtx, stopListening := context.WithCancel(ctx)
	stop = func() {
		stopListening()
		background.Wait()
		if trailing != nil {
			trailing.Stop()
		}
	}
	d.warnSmallPool(ctx)
	if !d.client.Config().NotifyDisabled {
		trailing = d.startListener(listenCtx, &background, signal)
	}
	if d.reconciler != nil {
		background.Go(func() { d.maintain(listenCtx, d.reconciler) })
	}
	return stop
}

// claimUntilDone claims due keys and starts their calls until ctx is done,
// sleeping between claims until a slot frees, a notification arrives or
// the poll interval passes.
func (d *Dispatcher[TTx]) claimUntilDone(ctx context.Context, r *run) {
	poll := time.NewTimer(0)
	defer poll.Stop()
	lastUnservedCheck := time.Time{}

	// Claim when at least half a batch of slots is free, or when idle: every
	// claim is a transaction of its own, and many small ones cost more than
	// the calls they carry.
	claimAt := max(1, min(d.config.BatchSize, d.config.Concurrency)/2)
	for ctx.Err() == nil {
		free := cap(r.slots) - len(r.slots)
		claimed := 0
		wait := d.config.PollInterval
		if free >= claimAt || free == cap(r.slots) {
			claimed, wait = d.claimAndStart(ctx, r, min(free, d.config.BatchSize), claimAt)
		}
		if d.config.UnservedAfter > 0 && time.Since(lastUnservedCheck) > min(d.config.UnservedAfter, time.Minute) {
			lastUnservedCheck = time.Now()
			d.reportUnserved(ctx)
		}
		if claimed > 0 && claimed == min(free, d.config.BatchSize) {
			continue // a full batch: more is likely due
		}
		if !poll.Stop() {
			select {
			case <-poll.C:
			default:
			}
		}
		poll.Reset(wait)
		select {
		case <-ctx.Done():
		case <-r.wake:
		case <-poll.C:
		}
	}
}

// claimAndStart claims up to limit keys and starts a call for each. It
// returns how many it claimed and how long the loop may sleep before the
// next claim.
func (d *Dispatcher[TTx]) claimAndStart(ctx context.Context, r *run, limit, claimAt int) (claimed int, wait time.Duration) {
	// The claim is the one oncetest's Drain makes too (see
	// [attempt.Claimer]): flow control, replicated claims and all.
	attempts, controlWait, err := d.claimer.Claim(ctx, &attempt.ClaimParams{
		Tools:   d.registry.Dispatched(),
		Limit:   limit,
		ClaimAt: claimAt,
		Poll:    d.config.PollInterval,
	})
	wait = min(d.config.PollInterval, controlWait)
	if err == nil {
		r.claimRetry = claimRetryMin
	} else {
		wait = min(wait, r.claimRetry)
		r.claimRetry = min(2*r.claimRetry, claimRetryMax)
	}
	if err != nil && ctx.Err() == nil {
		d.logger.ErrorContext(ctx, "pgonce: claim failed", "error", err, "retry_in", wait)
	}
	for _, a := range attempts {
		r.slots <- struct{}{}
		r.calls.Add(1)
		if r.takeIdle() {
			r.work <- a
		} else {
			r.workers.Go(func() { d.work(r, a) })
		}
	}
	return len(attempts), wait
}

// takeIdle takes one worker off the idle count, and reports whether there
// was one. The count is of the workers waiting on r.work less the calls
// being sent to them: a claim takes one to send a call, which one of them
// receives, and a worker whose wait timed out takes one to end.
func (r *run) takeIdle() bool {
	for {
		n := r.idle.Load()
		if n == 0 {
			return false
		}
		if r.idle.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// workerIdleTimeout is how long a worker waits for its next call before it
// ends: a dispatcher that ran many calls at once gives back their
// goroutines' memory once the load falls.
const workerIdleTimeout = 10 * time.Second

// work runs the call of a and then the calls handed to it on r.work, until
// that closes or no call comes for workerIdleTimeout.
//
// A worker counts itself idle before it frees its call's slot, so that the
// claim that takes the slot finds it: there are never more workers than
// Concurrency.
func (d *Dispatcher[TTx]) work(r *run, a attempt.Attempt) {
	idle := time.NewTimer(workerIdleTimeout)
	defer idle.Stop()
	for {
		d.call(r, a)
		r.idle.Add(1)
		<-r.slots
		r.signal()
		var ok bool
		if a, ok = r.awaitWork(idle); !ok {
			return
		}
	}
}

// awaitWork waits, as one of the idle workers, for the next call on r.work,
// and reports false when r.work closed or the worker may end: no call came
// for workerIdleTimeout and an idle worker is left to end. When every idle
// worker was taken by a claim that is sending it a call, it waits on.
func (r *run) awaitWork(idle *time.Timer) (attempt.Attempt, bool) {
	for {
		idle.Reset(workerIdleTimeout)
		select {
		case a, ok := <-r.work:
			return a, ok
		case <-idle.C:
			if r.takeIdle() {
				return attempt.Attempt{}, false
			}
		}
	}
}

// call runs the provider for a claimed attempt and hands its outcome to
// the recorder. The slot its claim took is freed by its worker once it
// returns, after the outcome is recorded.
func (d *Dispatcher[TTx]) call(r *run, a attempt.Attempt) {
	defer r.calls.Done()
	out := d.attempts.Run(r.callCtx, a, d.backoff)
	if r.callCtx.Err() != nil {
		// Cut off by the shutdown timeout: whether the provider acted is
		// unknown, and the reconciler decides once the lease expires.
		return
	}
	if out.SlowDown > 0 && d.throttle(r.callCtx, &out) {
		return
	}
	// The slot is freed once the outcome is recorded, so that leases held
	// without a recorded outcome never exceed Concurrency: a crash strands
	// at most that many.
	recorded := make(chan struct{})
	r.outcomes <- pendingOutcome{outcome: out, metadata: a.Request.Metadata, recorded: recorded}
	<-recorded
}

// finishCalls lets calls in flight finish, for up to ShutdownTimeout, then
// cuts off those still running: they stay in flight for the reconciler.
func (d *Dispatcher[TTx]) finishCalls(r *run) {
	finished := make(chan struct{})
	go func() {
		r.calls.Wait()
		close(finished)
	}()
	select {
	case <-finished:
	case <-time.After(max(d.config.ShutdownTimeout, 0)):
		d.logger.Warn("pgonce: shutdown timeout; calls still running stay in flight for the reconciler",
			"running", len(r.slots))
		r.hardStop()
		<-finished
	}
}

// backoff returns the delay before the retry after attempt: doubling from
// BackoffMin, capped at BackoffMax, jittered to between half and all of it.
func (d *Dispatcher[TTx]) backoff(attempt int) time.Duration {
	if d.config.BackoffFunc != nil {
		return d.config.BackoffFunc(attempt)
	}
	delay := d.config.BackoffMin
	for i := 1; i < attempt && delay < d.config.BackoffMax; i++ {
		delay *= 2
	}
	delay = min(delay, d.config.BackoffMax)
	if delay <= 1 {
		return delay
	}
	half := delay / 2
	return half + mathrand.N(delay-half+1)
}

// Bounds of the backoff between failed claims.
const (
	claimRetryMin = 50 * time.Millisecond
	claimRetryMax = 5 * time.Second
)

// startListener starts the listener that wakes the claim loop (signal) on
// every notification of new work, unless the pool is too small to listen
// and claim at once: the listener holds a connection for as long as it
// runs, and with a pool of one it would leave claims and records none. The
// dispatcher then polls every PollInterval, and says so. The listener runs
// until ctx is done, counted in background. trailing is the timer of a
// NotifyCooldown's trailing claim, or nil.
func (d *Dispatcher[TTx]) startListener(ctx context.Context, background *sync.WaitGroup, signal func()) (trailing *time.Timer) {
	release, maxConns, ok := d.store.ReserveListener()
	if !ok {
		d.logger.WarnContext(ctx, "pgonce: the connection pool is too small to listen and claim at once; polling every PollInterval instead of listening",
			"max_conns", maxConns, "poll_interval", d.config.PollInterval)
		return nil
	}
	onNotify := signal
	if cooldown := d.client.Config().NotifyCooldown; cooldown > 0 {
		// Submits under a cooldown leave some keys without a notification
		// of their own; a claim one cooldown after the last notification
		// finds them.
		trailing = time.AfterFunc(time.Hour, signal)
		trailing.Stop()
		onNotify = func() {
			signal()
			trailing.Reset(cooldown)
		}
	}
	background.Add(1)
	go func() {
		defer background.Done()
		defer release()
		d.listen(ctx, onNotify)
	}()
	return trailing
}

// listen calls onNotify on every notification of new work, and reconnects
// when its connection drops. Every (re)connection calls onNotify too, to
// catch up on what arrived while not listening: a notification this
// listener missed may have started a client's cooldown, whose submits then
// wait for the trailing claim that onNotify arms; and it makes the next
// claim read the tools' flow control again, whose change may have been
// notified meanwhile.
func (d *Dispatcher[TTx]) listen(ctx context.Context, onNotify func()) {
	d.store.ListenLoop(ctx, []string{d.store.WorkChannel}, d.client.Config().StatementTimeout,
		func() {
			d.claimer.Invalidate()
			onNotify()
		},
		func(n *pgconn.Notification) {
			if isToolNotification(n.Payload) {
				d.claimer.Invalidate()
			}
			onNotify()
		},
		func(err error, retryIn time.Duration) {
			d.logger.WarnContext(ctx, "pgonce: listener lost its connection; polling until it reconnects",
				"error", err, "retry_in", retryIn)
		})
}

// connsNeeded is how many connections a pool needs for a dispatcher and
// the waits of its client, in one process, to be woken by notifications:
// a listener each, and one for statements.
const connsNeeded = 3

// warnSmallPool warns when the pool has fewer than connsNeeded connections:
// the dispatcher or the waits then poll instead of listening, and every
// statement queues for one connection.
func (d *Dispatcher[TTx]) warnSmallPool(ctx context.Context) {
	config := d.client.Config()
	if maxConns := d.store.MaxConns(); maxConns > 0 && maxConns < connsNeeded && !config.NotifyDisabled && config.ListenConnectFunc == nil {
		d.logger.WarnContext(ctx, "pgonce: the connection pool is smaller than a dispatcher and waits in one process need; some of them poll instead of listening, and results reach waiters later",
			"max_conns", maxConns, "conns_needed", connsNeeded)
	}
}

func (d *Dispatcher[TTx]) reportUnserved(ctx context.Context) {
	countCtx, cancel := context.WithTimeout(ctx, d.client.Config().StatementTimeout)
	defer cancel()
	rows, err := d.store.CountUnserved(countCtx, &store.CountUnservedParams{
		// Inline-only tools are registered here and run by their callers:
		// their pending keys wait for them, and are not unserved.
		Tools: d.registry.Names(),
		Age:   d.config.UnservedAfter,
		Now:   d.attempts.NowParam(),
	})
	if err != nil {
		if ctx.Err() == nil {
			d.logger.ErrorContext(ctx, "pgonce: counting unserved rows failed", "error", err)
		}
		return
	}
	for _, row := range rows {
		d.logger.WarnContext(ctx, "pgonce: pending rows of a tool no dispatcher here serves",
			"tool", row.Tool, "waiting", row.Count, "oldest", row.Oldest)
	}
}
