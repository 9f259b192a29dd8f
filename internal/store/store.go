// Package store is the one seam between pgonce and its two drivers, native
// pgx and database/sql over the pgx stdlib driver.
//
// The store offers named operations with its own parameter and row types
// (the key passed in its text form): [Executor] for the statements that may
// run in a caller's transaction, [Store] for those that run on their own.
// The generated packages internal/dbpgx and internal/dbstd are imported
// here alone, and every conversion between their types and the store's
// stays here, so that a change of the schema's representation changes this
// package only.
//
// sqlc generates the same statements twice: internal/dbpgx for pgx and
// internal/dbstd for database/sql. Both emit identical Go types. Only the
// statements that run inside a caller's transaction exist in both; the
// operations of [Store] run through dbpgx on the pgx connection that sits
// under either driver, one connection per operation, held for that
// operation's statement alone.
//
// The statements in queries/ mark every table they name with
// `/* TEMPLATE: schema */`; the store fills the marker in with the client's
// schema, so that a caller's search_path is never read nor changed.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgonce/pgonce/internal/dbpgx"
	"github.com/pgonce/pgonce/internal/ident"
)

// ErrNoRows is returned when a statement that reads one row finds none. It is
// sql.ErrNoRows, which pgx.ErrNoRows also matches.
var ErrNoRows = sql.ErrNoRows

// ErrSerialization is returned when PostgreSQL aborted the transaction with a
// serialization failure or a deadlock (SQLSTATE 40001, 40P01). The whole
// transaction may be retried.
var ErrSerialization = errors.New("serialization failure")

// ErrTimeout is returned when PostgreSQL cancelled a statement under the
// session's lock_timeout (SQLSTATE 55P03) or statement_timeout (57014), not
// because the caller's context ended.
var ErrTimeout = errors.New("lock or statement timeout")

// ErrTxAborted is returned when a statement ran in a transaction that an
// earlier failed statement had aborted (SQLSTATE 25P02).
var ErrTxAborted = errors.New("transaction is aborted")

// ErrTxDone is returned when a statement ran in a transaction that had
// already committed or rolled back (sql.ErrTxDone, pgx.ErrTxClosed).
var ErrTxDone = errors.New("transaction has already been committed or rolled back")

// Executor runs the operations that may run inside a caller's transaction.
type Executor interface {
	// KeyInsert inserts a key claim, or returns [ErrNoRows] when the key or
	// its scope exists already (a tombstone included).
	KeyInsert(ctx context.Context, key *NewKey) (*InsertedKey, error)
	// KeyGet reads a key, or returns [ErrNoRows]; now, when not nil,
	// replaces the database's clock.
	KeyGet(ctx context.Context, key string, now *time.Time) (*KeyRow, error)
	// KeyGetByKeyOrScope reads the key, or else another key in its scope,
	// or returns [ErrNoRows].
	KeyGetByKeyOrScope(ctx context.Context, key, scope string, now *time.Time) (*KeyRow, error)
	// KeyInsertMany inserts pending key claims in one statement, in the
	// order given, and returns the keys it inserted: a key whose key or
	// scope exists already (a tombstone included) is skipped.
	KeyInsertMany(ctx context.Context, p *InsertManyParams) ([]*InsertedKey, error)
	// KeysByScope reads the keys of scopes, given in their hex form; a
	// scope without a key has no row.
	KeysByScope(ctx context.Context, scopes []string, now *time.Time) ([]*KeyRow, error)
	// KeyCompleteInTx records the final outcome of a key that the same
	// transaction claimed in flight, or returns [ErrNoRows] when the key is
	// not held by that attempt and worker.
	KeyCompleteInTx(ctx context.Context, p *CompleteInTxParams) error
	// KeyFinishInTx records the final outcome of an attempt of a
	// transactional tool in the transaction that holds its effect, and
	// reports whether it was written: false when the attempt no longer
	// holds the key (its lease was taken over), and the caller must roll
	// back.
	KeyFinishInTx(ctx context.Context, p *FinishInTxParams) (bool, error)
}

// CompleteInTxParams is the outcome [Executor.KeyCompleteInTx] records.
type CompleteInTxParams struct {
	Key     string
	Attempt int
	Worker  string
	// State is StateSucceeded or StateFailed, with Response or Failure.
	State              string
	Response           []byte
	Failure            []byte
	Retention          time.Duration
	TombstoneRetention time.Duration
	Now                *time.Time
}

func completeInTxParams(p *CompleteInTxParams) *dbpgx.KeyCompleteInTxParams {
	return &dbpgx.KeyCompleteInTxParams{
		State:       p.State,
		Response:    p.Response,
		Failure:     p.Failure,
		Now:         p.Now,
		RetentionMs: p.Retention.Milliseconds(),
		TombstoneMs: p.TombstoneRetention.Milliseconds(),
		Key:         keyDigest(p.Key),
		Attempt:     int32(p.Attempt), //nolint:gosec // attempts stay small
		Worker:      p.Worker,
	}
}

// Driver is what a client of transaction type TTx needs from its database.
type Driver[TTx any] interface {
	// UnwrapExecutor returns an executor that runs in tx.
	UnwrapExecutor(tx TTx) Executor
	// Store returns the transaction-free operations.
	Store() *Store
	// Begin opens a transaction of the driver's own, for a transactional
	// tool's attempt; Commit and Rollback end it. Their errors are
	// interpreted as every statement's are.
	Begin(ctx context.Context) (TTx, error)
	Commit(ctx context.Context, tx TTx) error
	Rollback(ctx context.Context, tx TTx) error
}

// Store holds the operations that need no caller's transaction: each runs as
// one statement on a pool connection, or holds a connection for listening.
type Store struct {
	// Schema is the validated schema that holds pgonce's tables.
	Schema string
	// WorkChannel is notified when pending work is ready.
	WorkChannel string
	// DoneChannel is notified with a key when the key is final.
	DoneChannel string

	template *template
	queries  *dbpgx.Queries
	// pgxFunc runs f with a pgx handle taken from the pool: one connection
	// at most, for f's duration.
	pgxFunc func(ctx context.Context, f func(db dbpgx.DBTX) error) error
	// connFunc runs f with a connection held for f's whole duration.
	connFunc func(ctx context.Context, f func(conn *pgx.Conn) error) error
	// maxConnsFunc returns the most connections the pool opens at once, or
	// 0 for no limit.
	maxConnsFunc func() int
	// versionFunc reads the migration version applied to the schema and the
	// one this build needs, writing nothing.
	versionFunc func(ctx context.Context) (applied, needed int64, err error)
	executor    Executor

	// listenConnectFunc, when set, opens the connection of each listener,
	// which closes it: a direct connection past a transaction pooler.
	listenConnectFunc func(ctx context.Context) (*pgx.Conn, error)
	// listenDisabled makes [Store.ReserveListener] refuse every listener:
	// the pool sits behind a transaction pooler, through which LISTEN
	// loses notifications, and no direct connection was given.
	listenDisabled bool

	mu sync.Mutex
	// listeners counts the connections reserved by [Store.ReserveListener].
	listeners int
}

// ListenOver makes the store's listeners connect with connect instead of
// holding a connection of the pool: each listener opens a connection of
// its own and closes it when it stops. A nil connect with disabled true
// refuses every listener ([Store.ReserveListener] reports false): the pool
// is behind a transaction pooler, which hands a session's server
// connection to other clients between transactions, so that a LISTEN
// through it hears nothing. Call it before the store is used.
func (s *Store) ListenOver(connect func(ctx context.Context) (*pgx.Conn, error), disabled bool) {
	s.listenConnectFunc, s.listenDisabled = connect, disabled && connect == nil
}

// ListenDisabled reports whether [Store.ListenOver] refused every listener.
func (s *Store) ListenDisabled() bool { return s.listenDisabled }

func newStore(schema string, pgxFunc func(context.Context, func(dbpgx.DBTX) error) error,
	connFunc func(context.Context, func(*pgx.Conn) error) error, maxConnsFunc func() int,
	versionFunc func(context.Context) (int64, int64, error), executor func(*Store) Executor,
) (*Store, error) {
	tpl := newTemplate(schema)
	s := &Store{
		Schema:       schema,
		WorkChannel:  ident.WorkChannel(schema),
		DoneChannel:  ident.DoneChannel(schema),
		template:     tpl,
		queries:      dbpgx.New(),
		pgxFunc:      pgxFunc,
		connFunc:     connFunc,
		maxConnsFunc: maxConnsFunc,
		versionFunc:  versionFunc,
	}
	s.executor = executor(s)
	return s, nil
}

// ReserveListener reserves a pool connection for a listener, which holds
// one for as long as it runs ([Store.ListenLoop]). Every other operation of
// the store holds at most one connection at a time, and only for a
// statement; a listener may take one only when, with it held, the pool still
// has a connection for those statements. With a pool of one connection, or
// of two while another listener of this store runs, ReserveListener refuses
// (ok is false) and the caller polls instead of listening. maxConns is the
// pool's limit, 0 for none; release gives the reservation back.
//
// The limit is the pool the store was built on: pgxpool's MaxConns, or
// database/sql's SetMaxOpenConns. Listeners of other stores over the same
// pool are not counted.
func (s *Store) ReserveListener() (release func(), maxConns int, ok bool) {
	maxConns = s.maxConnsFunc()
	if s.listenDisabled {
		return nil, maxConns, false
	}
	if s.listenConnectFunc != nil {
		// The listener's connection is its own, not the pool's.
		return func() {}, maxConns, true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if maxConns > 0 && s.listeners+1 >= maxConns {
		return nil, maxConns, false
	}
	s.listeners++
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			s.listeners--
			s.mu.Unlock()
		})
	}, maxConns, true
}

// MaxConns returns the most connections the store's pool opens at once, or
// 0 for no limit.
func (s *Store) MaxConns() int { return s.maxConnsFunc() }

// Executor returns an executor that runs each statement on its own in the
// pool.
func (s *Store) Executor() Executor { return s.executor }

// run runs f, one operation's statement, with the generated pgx queries and
// a handle from the pool whose statements run in the store's schema. Under database/sql the handle is one connection held for f; f runs
// one statement and never takes another connection.
func (s *Store) run(ctx context.Context, f func(q *dbpgx.Queries, db dbpgx.DBTX) error) error {
	err := s.pgxFunc(ctx, func(db dbpgx.DBTX) error {
		return f(s.queries, pgxTemplated{db: db, tpl: s.template})
	})
	return s.interpretError(ctx, err)
}

// Listen holds one connection, listens on channels and passes each
// notification to handle until ctx is done or the connection fails. ready,
// if not nil, is called once the LISTEN statements have run.
//
// Taking the connection, each LISTEN, and a ping after every
// 2*timeout without a notification run under timeout: a listener whose
// server vanished without closing the connection (a half-open connection)
// would otherwise wait for notifications that never come, for as long as
// the operating system keeps the socket.
func (s *Store) Listen(ctx context.Context, channels []string, timeout time.Duration, ready func(), handle func(*pgconn.Notification)) error {
	acquireCtx, cancelAcquire := context.WithTimeout(ctx, timeout)
	defer cancelAcquire()
	connFunc := s.connFunc
	if s.listenConnectFunc != nil {
		connFunc = func(ctx context.Context, f func(*pgx.Conn) error) error {
			conn, err := s.listenConnectFunc(ctx)
			if err != nil {
				return fmt.Errorf("connect: %w", err)
			}
			defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
			return f(conn)
		}
	}
	return connFunc(acquireCtx, func(conn *pgx.Conn) error {
		cancelAcquire() // the connection is held; only its acquisition was bounded
		for _, channel := range channels {
			if err := withTimeout(ctx, timeout, func(ctx context.Context) error {
				_, err := conn.Exec(ctx, "LISTEN "+ident.Quote(channel))
				return err
			}); err != nil {
				return fmt.Errorf("listen: %w", err)
			}
		}
		// The connection goes back to a pool: leave it listening to nothing.
		defer func() {
			_ = withTimeout(context.WithoutCancel(ctx), timeout, func(ctx context.Context) error {
				_, err := conn.Exec(ctx, "UNLISTEN *")
				return err
			})
		}()
		if ready != nil {
			ready()
		}
		for {
			idleCtx, cancelIdle := context.WithTimeout(ctx, 2*timeout)
			notification, err := conn.WaitForNotification(idleCtx)
			cancelIdle()
			switch {
			case err == nil:
				handle(notification)
			case ctx.Err() != nil:
				return ctx.Err()
			case errors.Is(err, context.DeadlineExceeded) && !conn.IsClosed():
				// Quiet for a while: make sure the server is still there.
				if err := withTimeout(ctx, timeout, conn.Ping); err != nil {
					return fmt.Errorf("listener ping: %w", err)
				}
			default:
				return err
			}
		}
	})
}

func withTimeout(ctx context.Context, timeout time.Duration, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return f(ctx)
}

// Reconnect bounds of [Store.ListenLoop].
const (
	listenRetryMin = 100 * time.Millisecond
	listenRetryMax = 5 * time.Second
)

// ListenLoop runs [Store.Listen] until ctx is done, reconnecting after a
// lost connection with a backoff from 100ms to 5s; timeout is Listen's.
// ready is called after
// every (re)connection, so the caller can catch up on what arrived while it
// was not listening; lost, if not nil, is told of each lost connection.
// Callers hold a reservation of [Store.ReserveListener] while it runs.
func (s *Store) ListenLoop(ctx context.Context, channels []string, timeout time.Duration, ready func(), handle func(*pgconn.Notification), lost func(err error, retryIn time.Duration)) {
	retry := listenRetryMin
	for ctx.Err() == nil {
		err := s.Listen(ctx, channels, timeout, func() {
			retry = listenRetryMin
			ready()
		}, handle)
		if ctx.Err() != nil {
			return
		}
		if lost != nil {
			lost(err, retry)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
		retry = min(2*retry, listenRetryMax)
	}
}

// InterpretError translates driver errors into the store's own: no rows,
// serialization failures and deadlocks, lock and statement timeouts, aborted
// and finished transactions. Errors the store does not know are returned as
// they are. Use [InterpretErrorContext] where the statement's context is at
// hand.
func InterpretError(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, pgx.ErrNoRows) || errors.Is(err, sql.ErrNoRows) {
		return ErrNoRows
	}
	if errors.Is(err, sql.ErrTxDone) || errors.Is(err, pgx.ErrTxClosed) {
		return ErrTxDone
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "40001", "40P01":
			return fmt.Errorf("%w (SQLSTATE %s): %s", ErrSerialization, pgErr.Code, pgErr.Message)
		case "55P03", "57014": // lock_not_available, query_canceled
			return fmt.Errorf("%w (SQLSTATE %s): %s", ErrTimeout, pgErr.Code, pgErr.Message)
		case "25P02": // in_failed_sql_transaction
			return fmt.Errorf("%w (SQLSTATE %s): %s", ErrTxAborted, pgErr.Code, pgErr.Message)
		}
	}
	return err
}

// InterpretErrorContext is [InterpretError] for a statement that ran under
// ctx: a statement cancelled (SQLSTATE 57014) while ctx is done was
// cancelled for the caller, whose context's error it returns, not
// [ErrTimeout].
func InterpretErrorContext(ctx context.Context, err error) error {
	var pgErr *pgconn.PgError
	if ctx.Err() != nil && errors.As(err, &pgErr) && pgErr.Code == "57014" {
		return fmt.Errorf("%w (SQLSTATE %s): %s", ctx.Err(), pgErr.Code, pgErr.Message)
	}
	return InterpretError(err)
}

// schemaMarker marks every place a statement in queries/ names one of
// pgonce's tables, as river's sqlc templates do: `/* TEMPLATE: schema */pgonce_key`.
// The store replaces it with the client's quoted schema and a dot, once per
// statement text.
const schemaMarker = "/* TEMPLATE: schema */"

// template fills the schema marker of statements in, once per statement
// text.
type template struct {
	prefix string
	cache  sync.Map // statement text -> statement text with the schema
}

func newTemplate(schema string) *template {
	return &template{prefix: ident.Quote(schema) + "."}
}

func (t *template) fill(query string) string {
	if cached, ok := t.cache.Load(query); ok {
		return cached.(string) //nolint:forcetypeassert // only strings are stored
	}
	filled := strings.ReplaceAll(query, schemaMarker, t.prefix)
	t.cache.Store(query, filled)
	return filled
}

// pgxTemplated runs statements in the store's schema.
type pgxTemplated struct {
	db  dbpgx.DBTX
	tpl *template
}

func (p pgxTemplated) Exec(ctx context.Context, query string, args ...any) (pgconn.CommandTag, error) {
	return p.db.Exec(ctx, p.tpl.fill(query), args...)
}

func (p pgxTemplated) Query(ctx context.Context, query string, args ...any) (pgx.Rows, error) {
	return p.db.Query(ctx, p.tpl.fill(query), args...)
}

func (p pgxTemplated) QueryRow(ctx context.Context, query string, args ...any) pgx.Row {
	return p.db.QueryRow(ctx, p.tpl.fill(query), args...)
}

// QueryExecMode returns the exec mode of a connection of the store's pool:
// pgxpool's, or that of the pgx connections under database/sql.
func (s *Store) QueryExecMode(ctx context.Context) (pgx.QueryExecMode, error) {
	var mode pgx.QueryExecMode
	err := s.connFunc(ctx, func(conn *pgx.Conn) error {
		mode = conn.Config().DefaultQueryExecMode
		return nil
	})
	return mode, s.interpretError(ctx, err)
}

// runInt64 runs f, one statement that returns a number (rows changed or
// counted), as [Store.run] does, and returns that number.
func runInt64(ctx context.Context, s *Store, f func(q *dbpgx.Queries, db dbpgx.DBTX) (int64, error)) (int64, error) {
	var n int64
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		var err error
		n, err = f(q, db)
		return err
	})
	return n, err
}
