package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/pgonce/pgonce/migrations"
	"github.com/pgonce/pgonce/outbox"
)

// compareTool is the one tool pgonce serves, and compareKind the kind of
// river's one job: both no-ops.
const (
	compareTool = "noop"
	compareKind = "noop"
)

// compareArgs are the arguments of every call and job: the same small JSON
// object on both sides, unique per call so that river's ByArgs uniqueness
// has something to work on.
type compareArgs struct {
	Round string `json:"round"`
	N     int64  `json:"n"`
}

// Kind is river's job kind.
func (compareArgs) Kind() string { return compareKind }

// environment holds what every phase shares: the pools, the schemas and
// the pgonce clients.
type environment struct {
	s    settings
	pool *pgxpool.Pool
	db   *sql.DB

	schemaPgonce string
	schemaRiver  string
	schemaApp    string
	schemaFloor  string

	pgoncePgx     *outbox.Client[pgx.Tx]
	pgonceSQL     *outbox.Client[*sql.Tx]
	pgonceCounter *counter

	serverVersion string
	riverVersion  string
	// postmaster is the pid of the server's postmaster when the server
	// runs on this machine, else 0: server CPU is then not measured.
	postmaster int
	// applicationName is the application_name of every connection of
	// the run.
	applicationName string

	// checkpointRefused is set once the server refused a CHECKPOINT: the
	// run goes on without them.
	checkpointRefused atomic.Bool
}

func newEnvironment(ctx context.Context, s settings) (env *environment, err error) {
	env = &environment{s: s}
	defer func() {
		if err != nil {
			env.close()
		}
	}()
	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	base := "compare_" + hex.EncodeToString(suffix[:])
	env.schemaPgonce, env.schemaRiver, env.schemaApp, env.schemaFloor = base+"_pgonce", base+"_river", base+"_app", base+"_floor"
	// Every connection of the run, pgbench's too, says it is the run's,
	// so that the server CPU of other clients of a shared server can be
	// told apart.
	env.applicationName = base

	config, err := pgxpool.ParseConfig(s.databaseURL)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	config.MaxConns = int32(s.maxConns) //nolint:gosec // bounded by the settings
	config.MaxConnIdleTime = time.Minute
	config.ConnConfig.RuntimeParams["application_name"] = env.applicationName
	sqlConfig := config.ConnConfig.Copy()
	if env.pool, err = pgxpool.NewWithConfig(ctx, config); err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if err = env.pool.Ping(ctx); err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	env.db = stdlib.OpenDB(*sqlConfig)
	env.db.SetMaxOpenConns(s.maxConns)
	env.db.SetMaxIdleConns(s.maxConns)
	env.db.SetConnMaxIdleTime(time.Minute)

	if err = env.pool.QueryRow(ctx, "SHOW server_version").Scan(&env.serverVersion); err != nil {
		return nil, fmt.Errorf("server version: %w", err)
	}
	env.riverVersion = moduleVersion("github.com/riverqueue/river")
	if env.postmaster, err = env.localPostmaster(ctx); err != nil {
		return nil, err
	}

	// pgonce in a schema of its own, as an application migrates it.
	if err = migrations.Up(ctx, env.db, env.schemaPgonce); err != nil {
		return nil, fmt.Errorf("migrate pgonce: %w", err)
	}
	// river in another, through rivermigrate's schema option; rivermigrate
	// expects the schema to exist.
	if _, err = env.pool.Exec(ctx, "CREATE SCHEMA "+quote(env.schemaRiver)); err != nil {
		return nil, fmt.Errorf("create river schema: %w", err)
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(env.pool), &rivermigrate.Config{
		Schema: env.schemaRiver,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return nil, fmt.Errorf("river migrator: %w", err)
	}
	if _, err = migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return nil, fmt.Errorf("migrate river: %w", err)
	}
	// The business table each caller transaction writes a row to.
	if _, err = env.pool.Exec(ctx, "CREATE SCHEMA "+quote(env.schemaApp)+";"+
		"CREATE TABLE "+env.businessTable()+` (
			id bigserial PRIMARY KEY,
			account text NOT NULL,
			amount bigint NOT NULL,
			created_at timestamptz NOT NULL DEFAULT now()
		)`); err != nil {
		return nil, fmt.Errorf("create business table: %w", err)
	}

	env.pgonceCounter = newCounter()
	registry := outbox.NewRegistry()
	if err = registry.Register(compareTool, outbox.ProviderFunc(env.pgonceCounter.call), outbox.IdempotentByKey); err != nil {
		return nil, fmt.Errorf("register: %w", err)
	}
	// The clients' defaults, but for the schema and a silent logger.
	clientConfig := outbox.Config{Schema: env.schemaPgonce, Registry: registry, Logger: slog.New(slog.DiscardHandler)}
	if env.pgoncePgx, err = outbox.NewPgx(env.pool, clientConfig); err != nil {
		return nil, fmt.Errorf("pgonce pgx client: %w", err)
	}
	if env.pgonceSQL, err = outbox.New(env.db, clientConfig); err != nil {
		return nil, fmt.Errorf("pgonce database/sql client: %w", err)
	}
	return env, nil
}

// close drops the schemas, unless the settings keep them, and closes the
// pools.
func (env *environment) close() {
	if env.pool != nil && !env.s.keep {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		for _, schema := range []string{env.schemaPgonce, env.schemaRiver, env.schemaApp, env.schemaFloor} {
			if schema == "" {
				continue
			}
			if _, err := env.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+quote(schema)+" CASCADE"); err != nil {
				fmt.Fprintf(os.Stderr, "compare: drop schema %s: %v\n", schema, err)
			}
		}
		cancel()
	}
	if env.db != nil {
		_ = env.db.Close()
	}
	if env.pool != nil {
		env.pool.Close()
	}
}

// describe says what runs where, for the head of the output.
func (env *environment) describe() string {
	host, _ := os.Hostname()
	s := env.s
	profile := "full"
	if s.quick {
		profile = "quick"
	}
	return fmt.Sprintf("pgonce beside river %s, %s profile, %d rounds\n"+
		"machine: %s, %d CPUs, %s/%s; PostgreSQL %s\n"+
		"drain %d calls; enqueue %d transactions per block at %s clients; end to end %d calls from %d callers; floor %d rows, %d pgbench clients, batches of %d\n"+
		"schemas %s, %s, %s, %s; %s",
		env.riverVersion, profile, s.rounds,
		host, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, env.serverVersion,
		s.drainCalls, s.enqueueTx, joinInts(s.enqueueClients), s.e2eCalls, s.e2eCallers, s.floorRows, s.floorClients, s.floorBatch,
		env.schemaPgonce, env.schemaRiver, env.schemaApp, env.schemaFloor, env.describeServerCPU())
}

// describeServerCPU says whether and where the server's CPU is read.
func (env *environment) describeServerCPU() string {
	if env.postmaster == 0 {
		return "server CPU not measured (the server's processes are not on this machine)"
	}
	return fmt.Sprintf("server CPU read from %s (postmaster %d and its children; the run's share: application_name %s and the background processes)", procDir, env.postmaster, env.applicationName)
}

func (env *environment) businessTable() string {
	return quote(env.schemaApp) + ".business"
}

// truncate empties tables between measurements, so that every round starts
// from the same tables.
func (env *environment) truncate(ctx context.Context, tables ...string) error {
	_, err := env.pool.Exec(ctx, "TRUNCATE "+strings.Join(tables, ", "))
	if err != nil {
		return fmt.Errorf("truncate: %w", err)
	}
	return nil
}

// analyze refreshes the planner's statistics after a fill, as autovacuum
// would on a long-lived queue.
func (env *environment) analyze(ctx context.Context, table string) error {
	if _, err := env.pool.Exec(ctx, "ANALYZE "+table); err != nil {
		return fmt.Errorf("analyze: %w", err)
	}
	return nil
}

func (env *environment) pgonceTable() string { return quote(env.schemaPgonce) + ".pgonce_key" }
func (env *environment) riverTable() string  { return quote(env.schemaRiver) + ".river_job" }

// awaitPgonceEmpty waits until pgonce's schema holds no open key: every
// outcome is recorded. Its two probes read the partial indexes of due and
// leased keys.
func (env *environment) awaitPgonceEmpty(ctx context.Context) error {
	return env.awaitPgonceEmptyIn(ctx, env.pgonceTable())
}

// awaitPgonceEmptyIn is awaitPgonceEmpty for the key table table.
func (env *environment) awaitPgonceEmptyIn(ctx context.Context, table string) error {
	return env.awaitFalse(ctx, `SELECT EXISTS (SELECT 1 FROM `+table+` WHERE state = 'open' AND lease_until IS NULL)
		OR EXISTS (SELECT 1 FROM `+table+` WHERE lease_until IS NOT NULL)`, "every pgonce outcome recorded")
}

// awaitRiverEmpty waits until river's schema holds no unfinished job: every
// completion is recorded. The probe reads river's fetch index, which leads
// with the state.
func (env *environment) awaitRiverEmpty(ctx context.Context) error {
	return env.awaitFalse(ctx, `SELECT EXISTS (SELECT 1 FROM `+env.riverTable()+`
		WHERE state IN ('available', 'pending', 'retryable', 'running', 'scheduled'))`, "every river job completed")
}

// awaitFalse polls query, a boolean, every 2 ms until it is false.
func (env *environment) awaitFalse(ctx context.Context, query, what string) error {
	ctx, cancel := context.WithTimeout(ctx, env.s.timeout)
	defer cancel()
	for {
		var open bool
		if err := env.pool.QueryRow(ctx, query).Scan(&open); err != nil {
			return fmt.Errorf("wait for %s: %w", what, err)
		}
		if !open {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s: %w", what, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// counter counts the no-op calls of one side and signals when a target is
// reached. When a latency log is armed, it also records when each call
// began.
type counter struct {
	calls   atomic.Int64
	target  atomic.Int64
	reached chan struct{}
	log     atomic.Pointer[latencyLog]
}

func newCounter() *counter { return &counter{reached: make(chan struct{}, 1)} }

// expect arms the counter to signal once n more calls have happened, and
// logs their start times in log when it is not nil. No call may be running.
func (c *counter) expect(n int, log *latencyLog) <-chan struct{} {
	c.log.Store(log)
	c.target.Store(c.calls.Load() + int64(n))
	return c.reached
}

// hit records one call of argument n.
func (c *counter) hit(n int64) {
	if log := c.log.Load(); log != nil {
		log.called(n)
	}
	if c.calls.Add(1) == c.target.Load() {
		c.reached <- struct{}{}
	}
}

// call is pgonce's no-op provider. It decodes the arguments only while a
// latency log is armed, as the log needs the call's number.
func (c *counter) call(_ context.Context, req outbox.Request) (json.RawMessage, error) {
	var n int64
	if c.log.Load() != nil {
		var args compareArgs
		if err := json.Unmarshal(req.Args, &args); err != nil {
			return nil, err
		}
		n = args.N
	}
	c.hit(n)
	return json.RawMessage(`{}`), nil
}

// await waits for a signal on reached, up to the settings' timeout.
func (env *environment) await(ctx context.Context, reached <-chan struct{}, what string) error {
	select {
	case <-reached:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(env.s.timeout):
		return fmt.Errorf("timed out waiting for %s", what)
	}
}

// latencyLog holds, per call number, when the submitting transaction's
// commit returned and when the provider or worker began the call, in Unix
// nanoseconds.
type latencyLog struct {
	committedAt []atomic.Int64
	calledAt    []atomic.Int64
}

func newLatencyLog(n int) *latencyLog {
	return &latencyLog{committedAt: make([]atomic.Int64, n), calledAt: make([]atomic.Int64, n)}
}

func (l *latencyLog) committed(n int64) {
	if n >= 0 && n < int64(len(l.committedAt)) {
		l.committedAt[n].Store(time.Now().UnixNano())
	}
}

func (l *latencyLog) called(n int64) {
	if n >= 0 && n < int64(len(l.calledAt)) {
		l.calledAt[n].Store(time.Now().UnixNano())
	}
}

// latencies returns call − commit of every call, in any order. A call can
// begin before its commit returns to the caller (the notification that
// wakes the dispatcher is sent at commit), so a latency can be negative.
func (l *latencyLog) latencies() ([]time.Duration, error) {
	out := make([]time.Duration, 0, len(l.calledAt))
	for n := range l.calledAt {
		committed, called := l.committedAt[n].Load(), l.calledAt[n].Load()
		if committed == 0 || called == 0 {
			return nil, fmt.Errorf("call %d: committed at %d, called at %d", n, committed, called)
		}
		out = append(out, time.Duration(called-committed))
	}
	return out, nil
}

// quote quotes an identifier for PostgreSQL.
func quote(name string) string { return pgx.Identifier{name}.Sanitize() }

// moduleVersion returns the version of module path linked into this binary.
func moduleVersion(path string) string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown version)"
	}
	for _, dep := range info.Deps {
		if dep.Path == path {
			return dep.Version
		}
	}
	return "(unknown version)"
}

func joinInts(list []int) string {
	parts := make([]string, len(list))
	for i, v := range list {
		parts[i] = fmt.Sprint(v)
	}
	return strings.Join(parts, ",")
}

// span is a timed section of one measurement: how long it took, and how
// many bytes of WAL the server wrote meanwhile (the whole server's: the
// harness is its only writer while it runs).
type span struct {
	elapsed  time.Duration
	walBytes int64
	// mallocs is the heap allocations of this process meanwhile: the
	// library's, and the harness's own, alike on both sides.
	mallocs uint64
	// serverCPU is the CPU time the server spent meanwhile on the
	// harness's behalf, and serverCPUAll the whole server's (see
	// [environment.readServerCPU]); both -1 when not measured.
	serverCPU, serverCPUAll time.Duration
	// clientCPU is the CPU time this process spent meanwhile: the
	// library's Go side (and the harness's own, alike on both sides), -1
	// when unreadable.
	clientCPU time.Duration
}

// timing is a section begun by startTiming.
type timing struct {
	began   time.Time
	lsn     int64
	mallocs uint64
	// cpu is the server's CPU time so far, when cpuRead.
	cpu     cpuReading
	cpuRead bool
	// clientCPU is this process's CPU time so far, -1 when unreadable.
	clientCPU time.Duration
}

// startTiming begins a timed section, after a CHECKPOINT unless the
// settings say otherwise or the server refused one.
func (env *environment) startTiming(ctx context.Context) (timing, error) {
	if env.s.checkpoint && !env.checkpointRefused.Load() {
		if _, err := env.pool.Exec(ctx, "CHECKPOINT"); err != nil {
			if ctx.Err() != nil {
				return timing{}, err
			}
			env.checkpointRefused.Store(true)
			log.Printf("CHECKPOINT refused (%v); measuring without them", err)
		}
	}
	lsn, err := env.walInsertLSN(ctx)
	// Read before the clock starts and the allocations are counted: the
	// scan of /proc is the harness's, not the measurement's.
	cpu, cpuRead := env.readServerCPU(ctx)
	return timing{began: time.Now(), lsn: lsn, mallocs: mallocs(), cpu: cpu, cpuRead: cpuRead, clientCPU: harnessCPU()}, err
}

// stopTiming ends the section t began. A failure to read the WAL position
// leaves walBytes negative: the measurement still counts, unpriced.
func (env *environment) stopTiming(ctx context.Context, t timing) span {
	elapsed := time.Since(t.began)
	measured := span{elapsed: elapsed, mallocs: mallocs() - t.mallocs, serverCPU: -1, serverCPUAll: -1, clientCPU: -1}
	if now := harnessCPU(); now >= 0 && t.clientCPU >= 0 {
		measured.clientCPU = now - t.clientCPU
	}
	if cpu, ok := env.readServerCPU(context.WithoutCancel(ctx)); ok && t.cpuRead {
		measured.serverCPU, measured.serverCPUAll = cpu.since(t.cpu)
	}
	lsn, err := env.walInsertLSN(context.WithoutCancel(ctx))
	if err != nil {
		measured.walBytes = -1
		return measured
	}
	measured.walBytes = lsn - t.lsn
	return measured
}

// harnessCPU is the CPU time, user and system, this process has spent so
// far, or -1 when the system does not tell.
func harnessCPU() time.Duration {
	var usage syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &usage); err != nil {
		return -1
	}
	return time.Duration(usage.Utime.Nano() + usage.Stime.Nano())
}

// mallocs is the process's count of heap allocations so far.
func mallocs() uint64 {
	var stats runtime.MemStats
	runtime.ReadMemStats(&stats)
	return stats.Mallocs
}

// walInsertLSN is the server's current WAL insert position, in bytes.
func (env *environment) walInsertLSN(ctx context.Context) (int64, error) {
	var lsn int64
	if err := env.pool.QueryRow(ctx, `SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint`).Scan(&lsn); err != nil {
		return 0, fmt.Errorf("read the WAL position: %w", err)
	}
	return lsn, nil
}
