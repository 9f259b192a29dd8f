package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/pgonce/pgonce/dispatcher"
)

// runEndToEnd times, on each side, e2eCallers goroutines committing
// e2eCalls caller transactions (a business row, and a SubmitTx or a
// unique InsertTx beside it) while one dispatcher or one river client, with
// the tuned settings of the drain, runs the calls; it ends when every
// outcome is recorded. It also reports commit-to-call latency: from the
// moment a caller's commit returns to the moment the provider or worker
// begins that call.
func (env *environment) runEndToEnd(ctx context.Context, round int, forward bool) ([]result, error) {
	type variant struct {
		name string
		run  func(context.Context, string, int, submitFunc) (span, *latencyLog, error)
	}
	variants := []variant{
		{endToEndPgonce, env.endToEndPgonce},
		{endToEndRiver, env.endToEndRiver},
	}
	var results []result
	for _, v := range order(measured(env.s, variants, func(v variant) string { return v.name }), forward) {
		if err := env.warm(ctx, env.s.e2eCallers); err != nil {
			return results, err
		}
		measured, log, err := v.run(ctx, fmt.Sprintf("e2e/%d/%s", round, v.name), env.s.e2eCalls, env.closedLoop)
		env.releaseIdle()
		if err != nil {
			return results, fmt.Errorf("%s: %w", v.name, err)
		}
		latencies, err := log.latencies()
		if err != nil {
			return results, fmt.Errorf("%s: %w", v.name, err)
		}
		results = append(results, result{
			round: round, phase: phaseEndToEnd, variant: v.name, clients: 0, count: env.s.e2eCalls, elapsed: measured.elapsed, walBytes: measured.walBytes, mallocs: measured.mallocs, serverCPU: measured.serverCPU, serverCPUAll: measured.serverCPUAll, clientCPU: measured.clientCPU,
			p50: quantile(latencies, 0.50), p99: quantile(latencies, 0.99), hasLatency: true,
		})
	}
	return results, nil
}

// businessRow inserts the caller's own row into tx.
func (env *environment) businessRow(ctx context.Context, tx pgx.Tx, n int64) error {
	_, err := tx.Exec(ctx, env.businessInsert(), businessAccount(n), n)
	return err
}

// businessInsert is the caller's own statement in every transaction.
func (env *environment) businessInsert() string {
	return "INSERT INTO " + env.businessTable() + " (account, amount) VALUES ($1, $2)"
}

func businessAccount(n int64) string { return fmt.Sprintf("account-%d", n) }

func (env *environment) endToEndPgonce(ctx context.Context, runID string, count int, submit submitFunc) (span, *latencyLog, error) {
	if err := env.truncate(ctx, env.businessTable(), env.pgonceTable()); err != nil {
		return span{}, nil, err
	}
	d, err := dispatcher.New(env.pgoncePgx, pgonceTunedConfig())
	if err != nil {
		return span{}, nil, fmt.Errorf("dispatcher: %w", err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	stopped := func(err error) error {
		stop()
		if runErr := <-done; runErr != nil && !errors.Is(runErr, context.Canceled) {
			err = errors.Join(err, fmt.Errorf("dispatcher: %w", runErr))
		}
		return err
	}

	// One call through the running dispatcher first: it is listening and
	// warm before the clock starts.
	reached := env.pgonceCounter.expect(1, nil)
	if err := pgx.BeginFunc(ctx, env.pool, func(tx pgx.Tx) error {
		_, err := env.pgoncePgx.SubmitTx(ctx, tx, pgonceCall(runID+"/warm", 0))
		return err
	}); err != nil {
		return span{}, nil, stopped(fmt.Errorf("warm-up: %w", err))
	}
	if err := env.await(ctx, reached, "the warm-up call"); err != nil {
		return span{}, nil, stopped(err)
	}
	if err := env.awaitPgonceEmpty(ctx); err != nil {
		return span{}, nil, stopped(err)
	}

	log := newLatencyLog(count)
	reached = env.pgonceCounter.expect(count, log)
	timing, err := env.startTiming(ctx)
	if err != nil {
		return span{}, nil, stopped(err)
	}
	err = submit(ctx, count, func(ctx context.Context, n int64) error {
		return pgx.BeginFunc(ctx, env.pool, func(tx pgx.Tx) error {
			if err := env.businessRow(ctx, tx, n); err != nil {
				return err
			}
			_, err := env.pgoncePgx.SubmitTx(ctx, tx, pgonceCall(runID, n))
			return err
		})
	}, log)
	if err == nil {
		err = env.await(ctx, reached, "the provider calls")
	}
	if err == nil {
		err = env.awaitPgonceEmpty(ctx)
	}
	measured := env.stopTiming(ctx, timing)
	env.pgonceCounter.expect(0, nil)
	return measured, log, stopped(err)
}

func (env *environment) endToEndRiver(ctx context.Context, runID string, count int, submit submitFunc) (span, *latencyLog, error) {
	if err := env.truncate(ctx, env.businessTable(), env.riverTable()); err != nil {
		return span{}, nil, err
	}
	counter := newCounter()
	client, err := env.newRiverClient(riverTunedConfig(), counter)
	if err != nil {
		return span{}, nil, err
	}
	if err := client.Start(ctx); err != nil {
		return span{}, nil, fmt.Errorf("start: %w", err)
	}
	stopped := func(err error) error {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if stopErr := client.Stop(stopCtx); stopErr != nil {
			err = errors.Join(err, fmt.Errorf("stop: %w", stopErr))
		}
		return err
	}
	unique := &river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}

	// One job through the running client first, as on pgonce's side.
	reached := counter.expect(1, nil)
	if err := pgx.BeginFunc(ctx, env.pool, func(tx pgx.Tx) error {
		_, err := client.InsertTx(ctx, tx, compareArgs{Round: runID + "/warm"}, unique)
		return err
	}); err != nil {
		return span{}, nil, stopped(fmt.Errorf("warm-up: %w", err))
	}
	if err := env.await(ctx, reached, "the warm-up job"); err != nil {
		return span{}, nil, stopped(err)
	}
	if err := env.awaitRiverEmpty(ctx); err != nil {
		return span{}, nil, stopped(err)
	}

	log := newLatencyLog(count)
	reached = counter.expect(count, log)
	timing, err := env.startTiming(ctx)
	if err != nil {
		return span{}, nil, stopped(err)
	}
	err = submit(ctx, count, func(ctx context.Context, n int64) error {
		return pgx.BeginFunc(ctx, env.pool, func(tx pgx.Tx) error {
			if err := env.businessRow(ctx, tx, n); err != nil {
				return err
			}
			_, err := client.InsertTx(ctx, tx, compareArgs{Round: runID, N: n}, unique)
			return err
		})
	}, log)
	if err == nil {
		err = env.await(ctx, reached, "the worker's jobs")
	}
	if err == nil {
		err = env.awaitRiverEmpty(ctx)
	}
	measured := env.stopTiming(ctx, timing)
	return measured, log, stopped(err)
}
