package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverdatabasesql"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/pgonce/pgonce/dispatcher"
	"github.com/pgonce/pgonce/migrations"
	"github.com/pgonce/pgonce/outbox"
)

// The tuned settings of the drain: pgonce's many call slots and big
// batches, river's many workers and short fetch intervals, as many slots
// as workers (about). Both sides' defaults run beside them.
const (
	tunedConcurrency     = 2048
	tunedBatchSize       = 2000
	tunedRiverWorkers    = 2000
	tunedFetchCooldown   = 2 * time.Millisecond
	tunedFetchPoll       = 20 * time.Millisecond
	defaultRiverWorkers  = 100
	fillTransactionCalls = 1000
	fillCallers          = 4
)

// pgonceTunedConfig is the tuned dispatcher's config: the tuned constants,
// or PGONCE_COMPARE_TUNED_CONCURRENCY and PGONCE_COMPARE_TUNED_BATCH where
// set, to explore others.
func pgonceTunedConfig() dispatcher.Config {
	concurrency, _ := envInt("PGONCE_COMPARE_TUNED_CONCURRENCY", tunedConcurrency)
	batch, _ := envInt("PGONCE_COMPARE_TUNED_BATCH", tunedBatchSize)
	return dispatcher.Config{Concurrency: concurrency, BatchSize: batch}
}

func riverTunedConfig() *river.Config {
	return &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: tunedRiverWorkers}},
		FetchCooldown:     tunedFetchCooldown,
		FetchPollInterval: tunedFetchPoll,
	}
}

// riverDefaultConfig is river's defaults, with the MaxWorkers of its
// documentation's examples: river requires a number.
func riverDefaultConfig() *river.Config {
	return &river.Config{Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: defaultRiverWorkers}}}
}

// runDrain drains a backlog of the settings' drainCalls with each of the
// variants, in the round's order.
func (env *environment) runDrain(ctx context.Context, round int, forward bool) ([]result, error) {
	type variant struct {
		name string
		run  func(context.Context, string) (span, error)
	}
	variants := []variant{
		{drainPgonceTuned, func(ctx context.Context, id string) (span, error) {
			return env.drainPgonce(ctx, id, pgonceTunedConfig(), driverPgx)
		}},
		{drainPgonceTunedSQL, func(ctx context.Context, id string) (span, error) {
			return env.drainPgonce(ctx, id, pgonceTunedConfig(), driverSQL)
		}},
		{drainPgonceDefault, func(ctx context.Context, id string) (span, error) {
			return env.drainPgonce(ctx, id, dispatcher.Config{}, driverPgx)
		}},
		{drainPgonceLimited, func(ctx context.Context, id string) (span, error) {
			return env.drainPgonceLimited(ctx, id)
		}},
		{drainPgonceFreshAnalyzed, func(ctx context.Context, id string) (span, error) {
			return env.drainPgonceFresh(ctx, id, true, false, driverPgx)
		}},
		{drainPgonceFreshUnanalyzed, func(ctx context.Context, id string) (span, error) {
			return env.drainPgonceFresh(ctx, id, false, false, driverPgx)
		}},
		{drainPgonceFreshUnanalyzedSQL, func(ctx context.Context, id string) (span, error) {
			return env.drainPgonceFresh(ctx, id, false, false, driverSQL)
		}},
		{drainPgoncePkeyAnalyzed, func(ctx context.Context, id string) (span, error) {
			return env.drainPgonceFresh(ctx, id, true, true, driverPgx)
		}},
		{drainPgoncePkeyUnanalyzed, func(ctx context.Context, id string) (span, error) {
			return env.drainPgonceFresh(ctx, id, false, true, driverPgx)
		}},
		{drainRiverTuned, func(ctx context.Context, id string) (span, error) {
			return env.drainRiver(ctx, id, riverTunedConfig(), driverPgx)
		}},
		{drainRiverTunedSQL, func(ctx context.Context, id string) (span, error) {
			return env.drainRiver(ctx, id, riverTunedConfig(), driverSQL)
		}},
		{drainRiverDefault, func(ctx context.Context, id string) (span, error) {
			return env.drainRiver(ctx, id, riverDefaultConfig(), driverPgx)
		}},
	}
	var results []result
	for _, v := range order(measured(env.s, variants, func(v variant) string { return v.name }), forward) {
		measured, err := v.run(ctx, fmt.Sprintf("drain/%d/%s", round, v.name))
		if err != nil {
			return results, fmt.Errorf("%s: %w", v.name, err)
		}
		results = append(results, result{round: round, phase: phaseDrain, variant: v.name, count: env.s.drainCalls, elapsed: measured.elapsed, walBytes: measured.walBytes, mallocs: measured.mallocs, serverCPU: measured.serverCPU, serverCPUAll: measured.serverCPUAll, clientCPU: measured.clientCPU})
	}
	return results, nil
}

// driver is the client side of a variant: pgx, or database/sql through
// pgx's stdlib driver.
type driver int

const (
	driverPgx driver = iota
	driverSQL
)

// runner is what a drain times: a pgonce dispatcher's Run.
type runner interface {
	Run(ctx context.Context) error
}

// newDispatcherFunc returns a dispatcher with config over one of the
// pgonce clients.
type newDispatcherFunc func(config dispatcher.Config) (runner, error)

// dispatcherOver returns the newDispatcherFunc of client.
func dispatcherOver[TTx any](client *outbox.Client[TTx]) newDispatcherFunc {
	return func(config dispatcher.Config) (runner, error) {
		d, err := dispatcher.New(client, config)
		if err != nil {
			return nil, err
		}
		return d, nil
	}
}

// drainPgonce submits drainCalls calls through SubmitTx on pgx, outside
// the timer, then times one dispatcher with config, over the pgonce client
// of drv, from Run until every outcome is recorded.
func (env *environment) drainPgonce(ctx context.Context, runID string, config dispatcher.Config, drv driver) (span, error) {
	table := env.pgonceTable()
	if err := env.truncate(ctx, table); err != nil {
		return span{}, err
	}
	newDispatcher := dispatcherOver(env.pgoncePgx)
	if drv == driverSQL {
		newDispatcher = dispatcherOver(env.pgonceSQL)
	}
	return env.drainPgonceIn(ctx, env.pgoncePgx, newDispatcher, table, runID, config, true)
}

// drainPgonceLimited is the tuned drain of the tool under limits that
// never bind; they are cleared when it ends, whatever it measured.
func (env *environment) drainPgonceLimited(ctx context.Context, runID string) (span, error) {
	params := outbox.LimitParams{By: "compare", Reason: "the cost of limits that never bind"}
	if _, err := env.pgoncePgx.SetToolLimits(ctx, compareTool, outbox.ToolLimits{MaxInFlight: 1_000_000, Rate: 1_000_000}, params); err != nil {
		return span{}, fmt.Errorf("set limits: %w", err)
	}
	measured, err := env.drainPgonce(ctx, runID, pgonceTunedConfig(), driverPgx)
	if _, clearErr := env.pgoncePgx.SetToolLimits(context.WithoutCancel(ctx), compareTool, outbox.ToolLimits{}, params); clearErr != nil {
		err = errors.Join(err, fmt.Errorf("clear limits: %w", clearErr))
	}
	return measured, err
}

// drainPgonceIn fills fill's empty table with drainCalls calls, analyzes
// it when analyze is set, and times one dispatcher of newDispatcher, over
// a client of the same schema, with config draining it. The fill is on
// pgx whatever the dispatcher's driver: it is outside the timer, and the
// rows are the same.
func (env *environment) drainPgonceIn(ctx context.Context, fill *outbox.Client[pgx.Tx], newDispatcher newDispatcherFunc, table, runID string, config dispatcher.Config, analyze bool) (span, error) {
	if err := env.fillPgonce(ctx, fill, runID, env.s.drainCalls); err != nil {
		return span{}, err
	}
	if analyze {
		if err := env.analyze(ctx, table); err != nil {
			return span{}, err
		}
	}
	reached := env.pgonceCounter.expect(env.s.drainCalls, nil)
	d, err := newDispatcher(config)
	if err != nil {
		return span{}, fmt.Errorf("dispatcher: %w", err)
	}
	timing, err := env.startTiming(ctx)
	if err != nil {
		return span{}, err
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	err = env.await(ctx, reached, "the provider calls")
	if err == nil {
		err = env.awaitPgonceEmptyIn(ctx, table)
	}
	measured := env.stopTiming(ctx, timing)

	stop()
	if runErr := <-done; runErr != nil && !errors.Is(runErr, context.Canceled) {
		err = errors.Join(err, fmt.Errorf("dispatcher: %w", runErr))
	}
	return measured, err
}

// drainPgonceFresh is the tuned drain in a schema migrated for it alone,
// whose key table autovacuum never analyzes: the table of a service that
// filled it faster than autovacuum looked. With analyze it is analyzed
// after the fill, as drainPgonce's is. With primaryKey the key is the
// table's primary key, a unique B-tree, instead of its hash index, as an
// unreleased migration once made it so that statements joining a batch of
// keys to the table would not read all of it; they match on the unique
// scope now, and one run compares the two layouts. The dispatcher runs on
// drv.
func (env *environment) drainPgonceFresh(ctx context.Context, runID string, analyze, primaryKey bool, drv driver) (span, error) {
	schema := env.schemaPgonce + "_fresh"
	table := quote(schema) + ".pgonce_key"
	if err := migrations.Up(ctx, env.db, schema); err != nil {
		return span{}, fmt.Errorf("migrate fresh schema: %w", err)
	}
	defer func() { _, _ = env.pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+quote(schema)+" CASCADE") }()
	setup := "ALTER TABLE " + table + " SET (autovacuum_enabled = false)"
	if primaryKey {
		setup += "; ALTER TABLE " + table + " ADD CONSTRAINT pgonce_key_pkey PRIMARY KEY (key)" +
			"; DROP INDEX " + quote(schema) + ".pgonce_key_key_idx"
	}
	if _, err := env.pool.Exec(ctx, setup); err != nil {
		return span{}, fmt.Errorf("fresh schema: %w", err)
	}
	registry := outbox.NewRegistry()
	if err := registry.Register(compareTool, outbox.ProviderFunc(env.pgonceCounter.call), outbox.IdempotentByKey); err != nil {
		return span{}, fmt.Errorf("register: %w", err)
	}
	clientConfig := outbox.Config{Schema: schema, Registry: registry, Logger: slog.New(slog.DiscardHandler)}
	client, err := outbox.NewPgx(env.pool, clientConfig)
	if err != nil {
		return span{}, fmt.Errorf("fresh client: %w", err)
	}
	newDispatcher := dispatcherOver(client)
	if drv == driverSQL {
		sqlClient, err := outbox.New(env.db, clientConfig)
		if err != nil {
			return span{}, fmt.Errorf("fresh database/sql client: %w", err)
		}
		newDispatcher = dispatcherOver(sqlClient)
	}
	return env.drainPgonceIn(ctx, client, newDispatcher, table, runID, pgonceTunedConfig(), analyze)
}

// fillPgonce submits n calls of runID through client's SubmitTx,
// fillTransactionCalls to a transaction, from fillCallers goroutines.
func (env *environment) fillPgonce(ctx context.Context, client *outbox.Client[pgx.Tx], runID string, n int) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	chunks := make(chan int)
	for range fillCallers {
		wg.Go(func() {
			for first := range chunks {
				err := pgx.BeginFunc(ctx, env.pool, func(tx pgx.Tx) error {
					for step := first; step < min(first+fillTransactionCalls, n); step++ {
						if _, err := client.SubmitTx(ctx, tx, pgonceCall(runID, int64(step))); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	for first := 0; first < n; first += fillTransactionCalls {
		chunks <- first
	}
	close(chunks)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("fill: %w", err)
	}
	return nil
}

func pgonceCall(runID string, n int64) outbox.Call {
	return outbox.Call{RunID: runID, Step: n, Tool: compareTool, Args: compareArgs{Round: runID, N: n}}
}

// riverWorker is river's no-op worker, counting its jobs.
type riverWorker struct {
	river.WorkerDefaults[compareArgs]
	counter *counter
}

// Work does nothing but count.
func (w *riverWorker) Work(_ context.Context, job *river.Job[compareArgs]) error {
	w.counter.hit(job.Args.N)
	return nil
}

// newRiverClient returns a river client on pgx over river's schema with
// config, whose no-op worker counts into counter. A config without queues
// makes an insert-only client.
func (env *environment) newRiverClient(config *river.Config, counter *counter) (*river.Client[pgx.Tx], error) {
	return newRiverClientOn(env, riverpgxv5.New(env.pool), config, counter)
}

// newRiverSQLClient is newRiverClient on database/sql, through
// riverdatabasesql over the harness's *sql.DB. riverdatabasesql.New has no
// listener (only NewWithPgxListener, with a pgx pool beside it, has one),
// so a client that works jobs runs in poll-only mode: a producer fetches
// when the client starts, again as soon as a slot is free after a fetch
// that filled every slot it asked for (FetchCooldown apart), and otherwise
// every FetchPollInterval. A drain's backlog never waits for the poll but
// at its end; river's own insert notifications to its producers, which
// poll-only mode relies on, come only from inserts through the working
// client itself.
func (env *environment) newRiverSQLClient(config *river.Config, counter *counter) (*river.Client[*sql.Tx], error) {
	return newRiverClientOn(env, riverdatabasesql.New(env.db), config, counter)
}

// newRiverClientOn is newRiverClient on driver.
func newRiverClientOn[TTx any](env *environment, driver riverdriver.Driver[TTx], config *river.Config, counter *counter) (*river.Client[TTx], error) {
	config.Schema = env.schemaRiver
	config.Logger = slog.New(slog.DiscardHandler)
	if counter != nil {
		workers := river.NewWorkers()
		if err := river.AddWorkerSafely(workers, &riverWorker{counter: counter}); err != nil {
			return nil, err
		}
		config.Workers = workers
	}
	client, err := river.NewClient(driver, config)
	if err != nil {
		return nil, fmt.Errorf("river client: %w", err)
	}
	return client, nil
}

// riverService is what a river drain times: a client's Start and Stop.
type riverService interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
}

// drainRiver inserts drainCalls jobs with InsertManyFast on pgx, outside
// the timer, then times one client on drv with config from Start until
// every job is completed.
func (env *environment) drainRiver(ctx context.Context, runID string, config *river.Config, drv driver) (span, error) {
	table := env.riverTable()
	if err := env.truncate(ctx, table); err != nil {
		return span{}, err
	}
	counter := newCounter()
	var client riverService
	switch drv {
	case driverSQL:
		sqlClient, err := env.newRiverSQLClient(config, counter)
		if err != nil {
			return span{}, err
		}
		client = sqlClient
	default:
		pgxClient, err := env.newRiverClient(config, counter)
		if err != nil {
			return span{}, err
		}
		client = pgxClient
	}
	// The fill is on pgx whatever the client's driver, as pgonce's is.
	inserter, err := env.newRiverClient(&river.Config{}, nil)
	if err != nil {
		return span{}, err
	}
	params := make([]river.InsertManyParams, env.s.drainCalls)
	for n := range params {
		params[n] = river.InsertManyParams{Args: compareArgs{Round: runID, N: int64(n)}}
	}
	if _, err := inserter.InsertManyFast(ctx, params); err != nil {
		return span{}, fmt.Errorf("fill: %w", err)
	}
	if err := env.analyze(ctx, table); err != nil {
		return span{}, err
	}
	reached := counter.expect(env.s.drainCalls, nil)

	timing, err := env.startTiming(ctx)
	if err != nil {
		return span{}, err
	}
	if err := client.Start(ctx); err != nil {
		return span{}, fmt.Errorf("start: %w", err)
	}
	err = env.await(ctx, reached, "the worker's jobs")
	if err == nil {
		err = env.awaitRiverEmpty(ctx)
	}
	measured := env.stopTiming(ctx, timing)

	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if stopErr := client.Stop(stopCtx); stopErr != nil {
		err = errors.Join(err, fmt.Errorf("stop: %w", stopErr))
	}
	return measured, err
}
