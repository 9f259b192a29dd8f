package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// runPaced times commit-to-call latency at paced loads: for each of the
// settings' pacedRates, pgonce's dispatcher and river's client (tuned as in
// the drain) run the calls of e2eCallers goroutines that commit caller
// transactions at that rate, for pacedSeconds each. Unlike the end-to-end
// phase, whose callers commit as fast as they can, the load here is below
// what either side can take, so the latency is that of a service under a
// steady load rather than of a backlog. The result's clients field is the
// rate.
func (env *environment) runPaced(ctx context.Context, round int, forward bool) ([]result, error) {
	type variant struct {
		name string
		run  func(context.Context, string, int, submitFunc) (span, *latencyLog, error)
	}
	variants := []variant{
		{endToEndPgonce, env.endToEndPgonce},
		{endToEndRiver, env.endToEndRiver},
	}
	var results []result
	for _, rate := range env.s.pacedRates {
		count := rate * env.s.pacedSeconds
		for _, v := range order(measured(env.s, variants, func(v variant) string { return v.name }), forward) {
			if err := env.warm(ctx, env.s.e2eCallers); err != nil {
				return results, err
			}
			measured, log, err := v.run(ctx, fmt.Sprintf("paced/%d/%d/%s", round, rate, v.name), count, env.pacedBlock(rate))
			env.releaseIdle()
			if err != nil {
				return results, fmt.Errorf("%s at %d/s: %w", v.name, rate, err)
			}
			latencies, err := log.latencies()
			if err != nil {
				return results, fmt.Errorf("%s at %d/s: %w", v.name, rate, err)
			}
			results = append(results, result{
				round: round, phase: phasePaced, variant: v.name, clients: rate, count: count, elapsed: measured.elapsed, walBytes: measured.walBytes, mallocs: measured.mallocs, serverCPU: measured.serverCPU, serverCPUAll: measured.serverCPUAll, clientCPU: measured.clientCPU,
				p50: quantile(latencies, 0.50), p99: quantile(latencies, 0.99), hasLatency: true,
			})
		}
	}
	return results, nil
}

// submitFunc commits count caller transactions of tx, noting each commit
// in log.
type submitFunc func(ctx context.Context, count int, tx txFunc, log *latencyLog) error

// closedLoop is the end-to-end phase's submitFunc: e2eCallers goroutines
// commit as fast as they can.
func (env *environment) closedLoop(ctx context.Context, count int, tx txFunc, log *latencyLog) error {
	_, err := env.commitBlock(ctx, env.s.e2eCallers, count, tx, log)
	return err
}

// pacedBlock returns a submitFunc that releases transaction n at
// n ÷ rate seconds from its start to the first of e2eCallers idle
// goroutines. A transaction released while every caller is busy waits for
// one; its latency still runs from its own commit.
func (env *environment) pacedBlock(rate int) submitFunc {
	return func(ctx context.Context, count int, tx txFunc, log *latencyLog) error {
		ctx, cancel := context.WithTimeout(ctx, env.s.timeout)
		defer cancel()
		due := make(chan int64, count)
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			errs []error
		)
		for range env.s.e2eCallers {
			wg.Go(func() {
				for n := range due {
					if err := tx(ctx, n); err != nil {
						mu.Lock()
						errs = append(errs, fmt.Errorf("transaction %d: %w", n, err))
						mu.Unlock()
						cancel()
						return
					}
					log.committed(n)
				}
			})
		}
		start := time.Now()
		tick := time.NewTicker(250 * time.Microsecond)
		for released := int64(0); released < int64(count) && ctx.Err() == nil; {
			upTo := min(int64(time.Since(start).Seconds()*float64(rate))+1, int64(count))
			for ; released < upTo; released++ {
				due <- released
			}
			select {
			case <-tick.C:
			case <-ctx.Done():
			}
		}
		tick.Stop()
		close(due)
		wg.Wait()
		if len(errs) == 0 && ctx.Err() != nil {
			errs = append(errs, ctx.Err())
		}
		return errors.Join(errs...)
	}
}
