package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgonce/pgonce/internal/attempt"
	"github.com/pgonce/pgonce/internal/observe"
	"github.com/pgonce/pgonce/internal/store"
)

// Client claims keys, replays their outcomes and runs providers inline. It is
// generic over the caller's transaction type: [New] returns a
// Client[*sql.Tx] and [NewPgx] a Client[pgx.Tx]; both share one
// implementation. A Client is safe for concurrent use.
type Client[TTx any] struct {
	config   Config
	driver   store.Driver[TTx]
	store    *store.Store
	attempts *attempt.Runner
	// runnerHandle carries attempts to the dispatcher and reconciler
	// packages.
	runnerHandle
	waiters waiters
	// observer, nil when none, is told of prunes and operator actions (and,
	// through attempts, of the batches of dispatchers and reconcilers).
	observer observe.Observer

	// lastNotify is when a submit last notified, in Unix nanoseconds, for
	// [Config.NotifyCooldown].
	lastNotify atomic.Int64

	// waitPolledFunc, nil outside tests, is told each time a wait arms its
	// timer: the key and how long until it re-reads it.
	waitPolledFunc func(key Key, next time.Duration)
}

// New returns a client over db, which must be opened with pgx's stdlib
// driver (sql.Open("pgx", url) after importing
// github.com/jackc/pgx/v5/stdlib, or stdlib.OpenDBFromPool). Its
// [Client.SubmitTx] takes the caller's *sql.Tx. The schema must already be
// migrated (see the migrations package); New itself runs no statement, so
// call [Client.CheckSchema] at start-up to fail fast. A nil db returns an
// error matching [ErrInvalidConfig].
func New(db *sql.DB, config Config) (*Client[*sql.Tx], error) {
	if db == nil {
		return nil, fmt.Errorf("%w: db must not be nil", ErrInvalidConfig)
	}
	return newClient(config, func(schema string) (store.Driver[*sql.Tx], error) {
		return store.NewStdDriver(db, schema)
	})
}

// NewPgx returns a client over pool. Its [Client.SubmitTx] takes the
// caller's pgx.Tx. The schema must already be migrated (see the migrations
// package; pass it stdlib.OpenDBFromPool(pool)); NewPgx itself runs no
// statement, so call [Client.CheckSchema] at start-up to fail fast.
//
// With [PoolingTransaction], the pool must not keep prepared statements:
// its connection config's DefaultQueryExecMode must be
// pgx.QueryExecModeExec or pgx.QueryExecModeSimpleProtocol
// (default_query_exec_mode=exec in the URL), or NewPgx returns an error
// matching [ErrTransactionPooling]. A nil pool returns an error matching
// [ErrInvalidConfig].
func NewPgx(pool *pgxpool.Pool, config Config) (*Client[pgx.Tx], error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: pool must not be nil", ErrInvalidConfig)
	}
	if config.Pooling == PoolingTransaction {
		if err := checkExecMode(pool.Config().ConnConfig.DefaultQueryExecMode); err != nil {
			return nil, err
		}
	}
	return newClient(config, func(schema string) (store.Driver[pgx.Tx], error) {
		return store.NewPgxDriver(pool, schema)
	})
}

func newClient[TTx any](config Config, driverFunc func(schema string) (store.Driver[TTx], error)) (*Client[TTx], error) {
	config = config.withDefaults()
	if err := config.validate(); err != nil {
		return nil, err
	}
	if err := checkRegistryTx[TTx](config.Registry); err != nil {
		return nil, err
	}
	driver, err := driverFunc(config.Schema)
	if err != nil {
		return nil, err
	}
	c := &Client[TTx]{config: config, driver: driver, store: driver.Store(), observer: observe.Of(config.Middleware)}
	c.store.ListenOver(config.ListenConnectFunc, config.Pooling == PoolingTransaction)
	c.attempts = newRunner(c)
	c.runnerHandle = attempt.NewHandle(c.attempts)
	return c, nil
}

// CheckSchema reads, without writing anything, the migration version applied
// to the client's schema and returns an error matching [ErrNotMigrated] when
// the schema is missing or older than this build needs, naming both versions
// and the fix. Call it once at start-up, after [New] or [NewPgx], which take
// no context and run no statement:
//
//	client, err := outbox.NewPgx(pool, outbox.Config{Schema: "pgonce"})
//	if err != nil {
//		return err
//	}
//	if err := client.CheckSchema(ctx); err != nil {
//		return err // errors.Is(err, outbox.ErrNotMigrated): run migrations.Up
//	}
//
// Without the check, the first operation on such a schema returns the same
// error.
//
// With [PoolingTransaction], CheckSchema also reads the exec mode of a
// connection of the pool and returns an error matching
// [ErrTransactionPooling] when it prepares statements: the check that
// [NewPgx] makes at once, and that a *sql.DB allows only over a
// connection.
func (c *Client[TTx]) CheckSchema(ctx context.Context) error {
	if c.config.Pooling == PoolingTransaction {
		mode, err := c.store.QueryExecMode(ctx)
		if err != nil {
			return fmt.Errorf("check exec mode: %w", err)
		}
		if err := checkExecMode(mode); err != nil {
			return err
		}
	}
	return c.store.CheckSchema(ctx)
}

// checkExecMode refuses, for [PoolingTransaction], an exec mode that keeps
// prepared statements (or describes a statement in one round trip and runs
// it in another) on a connection that a transaction pooler may change
// between statements.
func checkExecMode(mode pgx.QueryExecMode) error {
	switch mode {
	case pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol:
		return nil
	}
	return fmt.Errorf("%w: %w: with PoolingTransaction the pool must not prepare statements: "+
		"set default_query_exec_mode=exec (or simple_protocol) in its URL, not %s", ErrInvalidConfig, ErrTransactionPooling, mode)
}

// Config returns the client's configuration, with defaults filled in.
func (c *Client[TTx]) Config() Config { return c.config }

// SubmitTx claims call's key inside tx, the caller's own transaction, with
// one single-row INSERT: the key's row is also its outbox entry. If tx rolls
// back, so does the key; once tx commits, a dispatcher runs the call.
//
// An existing key answers by its state: pending or in flight returns
// Created false and a retry-after hint; succeeded and failed return the
// stored response or failure verbatim; needs review returns that state. The
// same key or the same run and step with another tool or other arguments
// returns [ErrKeyConflict]; a pruned key returns [ErrExpired] with the
// tombstone's Result; a tool missing from the registry returns
// [ErrUnknownTool]. None of these writes anything. "One shape for every
// outcome" in docs/concepts.md states the rule all calls follow.
//
// A concurrent transaction that claimed the same key and has not committed
// makes SubmitTx wait until it ends. Under READ COMMITTED the waiter then
// sees the winner's key (or wins, if the other rolled back). Under
// REPEATABLE READ or SERIALIZABLE, PostgreSQL aborts the waiter instead, and
// SubmitTx returns [ErrSerialization]: roll back and retry the transaction.
//
// Validation errors ([ErrInvalidCall], [ErrNotCanonical], [ErrUnknownTool])
// and [ErrInvalidTx], for a nil tx, are returned before any SQL runs and
// leave tx as it was. A tx already committed or rolled back returns
// [ErrTxDone], one aborted by an earlier statement [ErrTxAborted], and a
// statement cancelled by the session's lock_timeout or statement_timeout
// [ErrTimeout]. After any error but a validation error, the caller's
// transaction may be aborted; roll it back.
func (c *Client[TTx]) SubmitTx(ctx context.Context, tx TTx, call Call) (Result, error) {
	if isNilTx(tx) {
		return Result{}, ErrInvalidTx
	}
	sub, err := c.prepare(call)
	if err != nil {
		return Result{}, err
	}
	res, _, err := c.claim(ctx, c.driver.UnwrapExecutor(tx), sub, call, false)
	return res, err
}

// Submit is [Client.SubmitTx] on its own: the key claim is written by one
// statement, which commits by itself before Submit returns, so no explicit
// transaction (and no extra round trip) is needed.
func (c *Client[TTx]) Submit(ctx context.Context, call Call) (Result, error) {
	sub, err := c.prepare(call)
	if err != nil {
		return Result{}, err
	}
	res, _, err := c.claim(ctx, c.store.Executor(), sub, call, false)
	return res, err
}

// Get returns key's current result with one index probe. It returns
// [ErrNotFound] for a key never submitted and [ErrExpired] for a pruned one.
func (c *Client[TTx]) Get(ctx context.Context, key Key) (Result, error) {
	if _, err := ParseKey(string(key)); err != nil {
		return Result{}, err
	}
	return c.get(ctx, c.store.Executor(), key)
}

func (c *Client[TTx]) get(ctx context.Context, exec store.Executor, key Key) (Result, error) {
	row, err := exec.KeyGet(ctx, string(key), c.nowParam())
	if errors.Is(err, store.ErrNoRows) {
		return Result{}, fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	if err != nil {
		return Result{}, fmt.Errorf("get key: %w", err)
	}
	res := c.resultFromRow(row, false)
	if res.State == StateExpired {
		return res, &ExpiredError{Key: res.Key, CompletedAt: res.CompletedAt}
	}
	return res, nil
}

// submission is a call ready to be claimed: its derivation, its tool and
// its encoded metadata.
type submission struct {
	derivation
	tool     *Tool
	metadata []byte
}

// prepare derives call's key, validates what travels outside it and finds
// its tool. Nothing is written.
func (c *Client[TTx]) prepare(call Call) (submission, error) {
	d, err := derive(call)
	if err != nil {
		return submission{}, err
	}
	metadata, err := encodeMetadata(call)
	if err != nil {
		return submission{}, err
	}
	tool := c.config.Registry.Lookup(call.Tool)
	if tool == nil {
		return submission{}, fmt.Errorf("%w: %q is not registered", ErrUnknownTool, call.Tool)
	}
	if tool.Delivery == LookupByNaturalID && call.NaturalID == "" {
		// Without a natural id, an uncertain attempt could not be looked up,
		// and the key would go to review however the provider answers.
		return submission{}, &InvalidCallError{
			Field:  "NaturalID",
			Reason: fmt.Sprintf("is required for tool %s, registered LookupByNaturalID", quoteShort(call.Tool)),
		}
	}
	return submission{derivation: d, tool: tool, metadata: metadata}, nil
}

// claim writes the key's row, or reads the row that was there first. With
// inFlight the new row is claimed at once under a lease, for Do. It reports
// whether this request created the key. The tool's delivery mode and key
// retention are stored with the key, for the reconciler.
func (c *Client[TTx]) claim(ctx context.Context, exec store.Executor, sub submission, call Call, inFlight bool) (Result, *store.InsertedKey, error) {
	d := sub.derivation
	params := c.newKey(sub, call)
	params.Now = c.nowParam()
	var notifyWindow *notifyWindow
	if inFlight && !call.scheduled() {
		params.Lease = c.config.Lease
		params.Worker = c.config.WorkerID
		params.ReplicatedClaim = sub.tool != nil && sub.tool.Opts.ReplicatedClaim
	} else if !c.config.NotifyDisabled {
		if notifyWindow = c.takeNotifyWindow(); notifyWindow != nil || c.config.NotifyCooldown <= 0 {
			params.Channel = c.store.WorkChannel
		}
	}
	// A conflicting row can vanish between the insert and the read (a
	// tombstone past its horizon, deleted); the next round then inserts.
	for range 3 {
		row, err := exec.KeyInsert(ctx, params)
		if err == nil {
			res := Result{
				Key:       d.Key,
				State:     StatePending,
				Created:   true,
				Tool:      call.Tool,
				Attempts:  row.Attempt,
				CreatedAt: row.CreatedAt,
				UpdatedAt: row.CreatedAt,
			}
			if row.LeaseUntil != nil {
				res.State = StateInFlight
			}
			res.RetryAfter = retryAfter(res.State, row.Now, row.AvailableAt, row.LeaseUntil)
			return res, row, nil
		}
		// Nothing was inserted, so nothing notified: give the window back
		// for the next submit.
		c.returnNotifyWindow(notifyWindow)
		notifyWindow = nil
		if !errors.Is(err, store.ErrNoRows) {
			return Result{}, nil, fmt.Errorf("claim key: %w", err)
		}
		existing, err := exec.KeyGetByKeyOrScope(ctx, string(d.Key), d.Scope, c.nowParam())
		if err == nil {
			res, err := c.answerExisting(existing, sub, call)
			return res, nil, err
		}
		if !errors.Is(err, store.ErrNoRows) {
			return Result{}, nil, fmt.Errorf("read existing key: %w", err)
		}
	}
	return Result{}, nil, fmt.Errorf("claim key %s: the conflicting row kept changing", d.Key)
}

func (c *Client[TTx]) resultFromRow(row *store.KeyRow, created bool) Result {
	res := Result{
		Key:       Key(row.Key),
		Created:   created,
		Tool:      row.Tool,
		Attempts:  row.Attempt,
		CreatedAt: row.CreatedAt,
		UpdatedAt: row.UpdatedAt,
	}
	if row.CompletedAt != nil {
		res.CompletedAt = *row.CompletedAt
	}
	if row.LastError != nil {
		res.LastError = *row.LastError
	}
	switch row.State {
	case dbStateOpen:
		res.State = StatePending
		if row.LeaseUntil != nil {
			res.State = StateInFlight
		}
		res.RetryAfter = retryAfter(res.State, row.Now, row.AvailableAt, row.LeaseUntil)
	case dbStateSucceeded:
		res.State, res.Response = StateSucceeded, row.Response
	case dbStateFailed:
		res.State, res.Failure = StateFailed, row.Failure
	case dbStateNeedsReview:
		res.State = StateNeedsReview
	case dbStateExpired:
		res.State = StateExpired
	case dbStateCancelled:
		res.State = StateCancelled
	}
	return res
}

// notifyWindow is a notification slot taken under [Config.NotifyCooldown]:
// the time it was taken, and the time of the one before it.
type notifyWindow struct{ taken, previous int64 }

// takeNotifyWindow returns a window when a submit may notify now under
// [Config.NotifyCooldown], and nil when the cooldown is off or a submit
// notified less than a cooldown ago.
func (c *Client[TTx]) takeNotifyWindow() *notifyWindow {
	if c.config.NotifyCooldown <= 0 {
		return nil
	}
	now := time.Now().UnixNano()
	last := c.lastNotify.Load()
	if now-last < c.config.NotifyCooldown.Nanoseconds() || !c.lastNotify.CompareAndSwap(last, now) {
		return nil
	}
	return &notifyWindow{taken: now, previous: last}
}

// returnNotifyWindow undoes w when the submit that took it did not notify,
// unless another submit has notified since.
func (c *Client[TTx]) returnNotifyWindow(w *notifyWindow) {
	if w != nil {
		c.lastNotify.CompareAndSwap(w.taken, w.previous)
	}
}

func derefTime(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

// Retry-after hints: never below retryAfterMin, so that a busy caller backs
// off, and never above retryAfterMax for in-flight keys, whose end nobody
// knows.
const (
	retryAfterMin = 100 * time.Millisecond
	retryAfterMax = 2 * time.Second
)

// retryAfter is the hint for a key in state, measured against now, the
// database's clock as the statement that read the row saw it: availableAt
// and leaseUntil are on that clock, and the caller's may disagree with it.
func retryAfter(state State, now, availableAt time.Time, leaseUntil *time.Time) time.Duration {
	if state == StateInFlight && leaseUntil != nil {
		return min(max(leaseUntil.Sub(now), retryAfterMin), retryAfterMax)
	}
	return max(availableAt.Sub(now), retryAfterMin)
}

// Now returns the client's current time: [Config.NowFunc]'s when set, the
// local clock's otherwise. It is not the database's clock, and pgonce never
// compares it with a stored timestamp: windows are measured from the clock
// the statements read.
func (c *Client[TTx]) Now() time.Time { return c.now() }

func (c *Client[TTx]) now() time.Time {
	if c.config.NowFunc != nil {
		return c.config.NowFunc()
	}
	return time.Now()
}

// statementContext bounds one statement pgonce runs on its own by
// [Config.StatementTimeout].
func (c *Client[TTx]) statementContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.config.StatementTimeout)
}

// nowParam is the time passed to statements: nil lets the database's clock
// decide, which keeps every lease on one clock.
func (c *Client[TTx]) nowParam() *time.Time {
	if c.config.NowFunc == nil {
		return nil
	}
	return ptr(c.config.NowFunc())
}

func ptr[T any](v T) *T { return &v }

// storedFingerprint is the fingerprint stored with call's key: only a
// business-key call has one. A step call's key already hashes its tool and
// canonical arguments, so a stored fingerprint would repeat what the key
// says; the same key is the same request.
func storedFingerprint(call Call, d derivation) string {
	if call.Key == "" {
		return ""
	}
	return d.Fingerprint
}
