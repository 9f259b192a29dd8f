package outbox

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pgonce/pgonce/migrations"
)

// Pooling says how the connections of a client's pool reach PostgreSQL,
// and so which session state pgonce may rely on between transactions.
type Pooling int

const (
	// PoolingSession is a pool of direct connections to PostgreSQL, or of
	// connections through a pooler in session mode: a connection keeps its
	// session, so listeners LISTEN over the pool.
	PoolingSession Pooling = iota
	// PoolingTransaction is a pool of connections through a pooler in
	// transaction mode (PgBouncer's pool_mode = transaction), which hands
	// the server connection to another client after each transaction. No
	// session state outlives a transaction: the pool must not keep prepared
	// statements (pgx's default_query_exec_mode=exec or simple_protocol),
	// and a LISTEN through the pooler hears nothing, so listeners connect
	// past it with [Config.ListenConnectFunc], or nobody listens and
	// dispatchers and waits poll.
	PoolingTransaction
)

// String returns "session" or "transaction".
func (p Pooling) String() string {
	switch p {
	case PoolingSession:
		return "session"
	case PoolingTransaction:
		return "transaction"
	}
	return fmt.Sprintf("Pooling(%d)", int(p))
}

const (
	// SchemaDefault is the schema of pgonce's tables when none is configured.
	SchemaDefault = "pgonce"
	// CallTimeoutDefault is the default deadline of one provider call.
	CallTimeoutDefault = 30 * time.Second
	// LeaseMarginMin is how much longer than the call timeout a lease must
	// last: the time to persist an outcome after the provider returns. An
	// outcome of 256 KiB or more, which may take longer to send, extends its
	// lease before it is recorded, and recording retries past the lease
	// (each outcome is fenced by its attempt), so the margin need only cover
	// small outcomes.
	LeaseMarginMin = time.Second
	// RetentionDefault is how long a finished key keeps its response.
	RetentionDefault = 30 * 24 * time.Hour
	// TombstoneRetentionDefault is how long a pruned key's tombstone is kept.
	TombstoneRetentionDefault = 365 * 24 * time.Hour
	// StatementTimeoutDefault is the default deadline of each statement
	// pgonce runs on its own.
	StatementTimeoutDefault = 5 * time.Second
	// NotifyCooldownDefault is how often a client's submits notify at most
	// (see [Config.NotifyCooldown]).
	NotifyCooldownDefault = 10 * time.Millisecond
)

// The development preset: with these, with
// dispatcher.MaintenanceIntervalDevelopment and
// reconcile.GraceDevelopment, an attempt whose worker crashed is resolved
// within seconds instead of the two minutes the defaults allow
// (docs/examples.md, "Development preset"). They suit a developer's
// machine and tests, not production: a provider call longer than
// CallTimeoutDevelopment is cut off, and the result is retried or sent to
// review by the tool's delivery.
const (
	// CallTimeoutDevelopment is the development preset's
	// [Config.CallTimeout].
	CallTimeoutDevelopment = 2 * time.Second
	// LeaseDevelopment is the development preset's [Config.Lease]: the
	// shortest lease CallTimeoutDevelopment allows.
	LeaseDevelopment = CallTimeoutDevelopment + LeaseMarginMin
)

// Config configures a [Client]. Its zero value works: every field has a
// default.
type Config struct {
	// Schema holds pgonce's tables; it must be migrated (see the migrations
	// package). A plain lower-case identifier. Defaults to "pgonce".
	Schema string

	// Registry holds the tools that may be submitted, and their providers.
	// Defaults to an empty registry, in which every submit fails with
	// [ErrUnknownTool].
	Registry *Registry

	// CallTimeout is the deadline of one provider call or lookup, made by
	// [Client.Do], by dispatchers and by reconcilers over this client.
	// Defaults to [CallTimeoutDefault]; the development preset sets
	// [CallTimeoutDevelopment].
	CallTimeout time.Duration

	// Lease is how long an attempt holds its key, by the database's clock:
	// a claim of [Client.Do], of a dispatcher, or of a reconciler over this
	// client. It must exceed CallTimeout by at least [LeaseMarginMin], so
	// that a live worker never outlives its claim. Defaults to
	// CallTimeout + 30s; the development preset sets [LeaseDevelopment].
	Lease time.Duration

	// Retention is how long a finished key keeps its response before pruning
	// turns it into a tombstone, for tools that do not set their own. It must
	// outlast every window in which a duplicate can arrive. Defaults to
	// [RetentionDefault], 30 days.
	Retention time.Duration

	// StatementTimeout is the deadline of each statement pgonce runs on its
	// own, outside a caller's transaction: the claims of [Client.Do] and of
	// dispatchers, recording outcomes, the reconciler's reclaims and counts,
	// and each batch of [Client.Prune]. A statement past it is cancelled and
	// its connection dropped (a connection whose server vanished without
	// closing it would otherwise hang it forever); loops log the error and go
	// on, and recording outcomes tries again within the lease. A statement
	// that records outcomes has StatementTimeout once more for every 256 KiB
	// of their responses and failures, which take that much longer to send.
	// Statements under the caller's context alone ([Client.SubmitTx],
	// [Client.Get], operator reads) have none. Defaults to [StatementTimeoutDefault], 5s.
	StatementTimeout time.Duration

	// TombstoneRetention is how long, from completion, a finished key is
	// remembered at all: after Retention its response goes and a tombstone
	// remains until then. It is fixed on each key when the key finishes.
	// Defaults to [TombstoneRetentionDefault], one year.
	TombstoneRetention time.Duration

	// NotifyDisabled turns off LISTEN/NOTIFY wake-ups: submits then never
	// notify, and dispatchers and waiters rely on polling alone. NOTIFY takes
	// a database-wide lock at commit; disable it only when measurements say
	// so. Defaults to false.
	NotifyDisabled bool

	// NotifyCooldown lets this client's submits notify at most once per
	// cooldown: a submit within the cooldown of the last one that notified
	// does not notify. PostgreSQL serialises the commits of notifying
	// transactions under one database-wide lock, held through the commit's
	// WAL flush, which more than halves throughput under many concurrent
	// submitters (docs/performance.md). A dispatcher whose client has a
	// cooldown claims again one cooldown after the last notification it
	// received, and after its listener (re)connects, which finds the keys
	// whose notification was left out (behind a notification the listener
	// missed, too); a
	// submit after a quiet cooldown notifies at once, so a call submitted
	// alone is claimed within milliseconds of its commit. The price: a key
	// left unannounced whose transaction commits later than that trailing
	// claim (a transaction that runs on for longer than the cooldown after
	// its submit, or one whose announcing neighbour rolled back) waits for
	// the next notification or the dispatcher's PollInterval. Use the same
	// cooldown on submitting and dispatching clients. Defaults to
	// [NotifyCooldownDefault], 10ms; a negative value means no cooldown:
	// every submit notifies.
	NotifyCooldown time.Duration

	// WorkerID names this process in leases, for operators: at most 200
	// bytes of valid UTF-8, without NUL bytes. Defaults to hostname:pid.
	WorkerID string

	// Logger receives the client's logs, and those of the dispatchers and
	// reconcilers over the client unless they are given their own.
	// Defaults to the handler of slog.Default() at the time of [New] or
	// [NewPgx], passed only records at [slog.LevelWarn] and above: a
	// library says nothing in a steady state unless asked, while warnings
	// and errors still reach the process's log. docs/operating.md lists
	// the log lines and their levels.
	Logger *slog.Logger

	// Pooling says how the pool's connections reach PostgreSQL: directly
	// (or through a session pooler), or through a transaction pooler such as
	// PgBouncer in transaction mode (docs/topologies.md). With
	// [PoolingTransaction], [NewPgx] refuses a pool that keeps prepared
	// statements, waits listen only over ListenConnectFunc, and a
	// dispatcher needs ListenConnectFunc or NotifyDisabled. Defaults to
	// [PoolingSession].
	Pooling Pooling

	// ListenConnectFunc, when set, opens the connection each listener (a
	// dispatcher's, and the one that all waits of the client share) holds
	// while it runs, instead of taking one from the client's pool; the
	// listener closes it when it stops. Behind a transaction pooler, it
	// connects to PostgreSQL directly (or through a session pooler), for
	// example:
	//
	//	ListenConnectFunc: func(ctx context.Context) (*pgx.Conn, error) {
	//		return pgx.Connect(ctx, directURL)
	//	},
	//
	// Defaults to nil: listeners hold a connection of the pool, unless
	// Pooling is [PoolingTransaction], when nobody listens.
	ListenConnectFunc func(ctx context.Context) (*pgx.Conn, error)

	// Middleware runs around every provider call and lookup of the client's
	// tools, made by [Client.Do], by dispatchers and by reconcilers over the
	// client, the first outermost, outside each tool's own
	// [ToolOpts.Middleware]. The slice is copied. A nil entry is an
	// [ErrInvalidConfig]. Defaults to none.
	Middleware []Middleware

	// NowFunc returns the current time for timestamps written by pgonce. nil
	// means the database's clock, which is what production should use;
	// tests set it to move time. Leases always follow the database's clock
	// unless NowFunc is set.
	NowFunc func() time.Time
}

func (c Config) withDefaults() Config {
	c.Schema = cmp.Or(c.Schema, SchemaDefault)
	if c.Registry == nil {
		c.Registry = NewRegistry()
	}
	c.CallTimeout = cmp.Or(c.CallTimeout, CallTimeoutDefault)
	c.Lease = cmp.Or(c.Lease, c.CallTimeout+30*time.Second)
	c.Retention = cmp.Or(c.Retention, RetentionDefault)
	c.TombstoneRetention = cmp.Or(c.TombstoneRetention, TombstoneRetentionDefault)
	c.StatementTimeout = cmp.Or(c.StatementTimeout, StatementTimeoutDefault)
	c.NotifyCooldown = cmp.Or(c.NotifyCooldown, NotifyCooldownDefault)
	if c.WorkerID == "" {
		host, _ := os.Hostname()
		c.WorkerID = fmt.Sprintf("%s:%d", cmp.Or(host, "localhost"), os.Getpid())
	}
	if c.Logger == nil {
		c.Logger = slog.New(minLevelHandler{next: slog.Default().Handler(), min: slog.LevelWarn})
	}
	c.Middleware = slices.Clone(c.Middleware)
	return c
}

func (c Config) validate() error {
	if err := migrations.ValidateSchema(c.Schema); err != nil {
		return err
	}
	switch {
	case slices.Contains(c.Middleware, nil):
		return fmt.Errorf("%w: Middleware must not hold nil", ErrInvalidConfig)
	case c.CallTimeout < 0:
		return fmt.Errorf("%w: CallTimeout must not be negative", ErrInvalidConfig)
	case c.Lease < c.CallTimeout+LeaseMarginMin:
		return fmt.Errorf("%w: Lease (%s) must exceed CallTimeout (%s) by at least %s", ErrInvalidConfig, c.Lease, c.CallTimeout, LeaseMarginMin)
	case c.Retention < 0:
		return fmt.Errorf("%w: Retention must not be negative", ErrInvalidConfig)
	case c.StatementTimeout < time.Millisecond:
		return fmt.Errorf("%w: StatementTimeout must be at least 1ms", ErrInvalidConfig)
	case c.Pooling != PoolingSession && c.Pooling != PoolingTransaction:
		return fmt.Errorf("%w: Pooling must be PoolingSession or PoolingTransaction, got %d", ErrInvalidConfig, int(c.Pooling))
	case c.TombstoneRetention < c.Retention:
		return fmt.Errorf("%w: TombstoneRetention (%s) must be at least Retention (%s)", ErrInvalidConfig, c.TombstoneRetention, c.Retention)
	case len(c.WorkerID) > 200:
		return fmt.Errorf("%w: WorkerID must be at most 200 bytes", ErrInvalidConfig)
	case !utf8.ValidString(c.WorkerID) || strings.IndexByte(c.WorkerID, 0) >= 0:
		// It is written into leases, as PostgreSQL text.
		return fmt.Errorf("%w: WorkerID must be valid UTF-8 without NUL bytes", ErrInvalidConfig)
	}
	return nil
}

// minLevelHandler passes next only the records at min and above: the
// default [Config.Logger].
type minLevelHandler struct {
	next slog.Handler
	min  slog.Level
}

func (h minLevelHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return level >= h.min && h.next.Enabled(ctx, level)
}

func (h minLevelHandler) Handle(ctx context.Context, r slog.Record) error {
	return h.next.Handle(ctx, r)
}

func (h minLevelHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return minLevelHandler{next: h.next.WithAttrs(attrs), min: h.min}
}

func (h minLevelHandler) WithGroup(name string) slog.Handler {
	return minLevelHandler{next: h.next.WithGroup(name), min: h.min}
}
