package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/pgonce/pgonce/outbox"
)

// callsPerManyTx is how many calls a transaction of the many-call
// variants submits: one at a time through SubmitTx, or all at once
// through SubmitManyTx; and how many unique jobs river's InsertManyTx
// inserts beside them.
const callsPerManyTx = 10

// txFunc is one caller transaction's work beside its commit: the business
// row, and the library's insert for all but the bare variants. n numbers
// the transaction within its block.
type txFunc func(ctx context.Context, n int64) error

// runEnqueue commits enqueueTx caller transactions with each variant at
// each client count, in the round's order. Every block starts from empty
// tables.
func (env *environment) runEnqueue(ctx context.Context, round int, forward bool) ([]result, error) {
	inserter, err := env.newRiverClient(&river.Config{}, nil)
	if err != nil {
		return nil, err
	}
	sqlInserter, err := env.newRiverSQLClient(&river.Config{}, nil)
	if err != nil {
		return nil, err
	}
	unique := &river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true}}
	business := env.businessInsert()

	type variant struct {
		name string
		tx   func(runID string) txFunc
	}
	pgxTx := func(body func(ctx context.Context, tx pgx.Tx, n int64) error) txFunc {
		return func(ctx context.Context, n int64) error {
			return pgx.BeginFunc(ctx, env.pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, business, businessAccount(n), n); err != nil {
					return err
				}
				return body(ctx, tx, n)
			})
		}
	}
	sqlTx := func(body func(ctx context.Context, tx *sql.Tx, n int64) error) txFunc {
		return func(ctx context.Context, n int64) error {
			tx, err := env.db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			if _, err = tx.ExecContext(ctx, business, businessAccount(n), n); err == nil {
				err = body(ctx, tx, n)
			}
			if err != nil {
				_ = tx.Rollback()
				return err
			}
			return tx.Commit()
		}
	}
	variants := []variant{
		{enqueueBarePgx, func(string) txFunc {
			return pgxTx(func(context.Context, pgx.Tx, int64) error { return nil })
		}},
		{enqueueBareSQL, func(string) txFunc {
			return sqlTx(func(context.Context, *sql.Tx, int64) error { return nil })
		}},
		{enqueuePgoncePgx, func(runID string) txFunc {
			return pgxTx(func(ctx context.Context, tx pgx.Tx, n int64) error {
				_, err := env.pgoncePgx.SubmitTx(ctx, tx, pgonceCall(runID, n))
				return err
			})
		}},
		{enqueuePgonceSQL, func(runID string) txFunc {
			return sqlTx(func(ctx context.Context, tx *sql.Tx, n int64) error {
				_, err := env.pgonceSQL.SubmitTx(ctx, tx, pgonceCall(runID, n))
				return err
			})
		}},
		{enqueuePgonceEach, func(runID string) txFunc {
			return pgxTx(func(ctx context.Context, tx pgx.Tx, n int64) error {
				for i := range int64(callsPerManyTx) {
					if _, err := env.pgoncePgx.SubmitTx(ctx, tx, pgonceCall(runID, n*callsPerManyTx+i)); err != nil {
						return err
					}
				}
				return nil
			})
		}},
		{enqueuePgonceMany, func(runID string) txFunc {
			return pgxTx(func(ctx context.Context, tx pgx.Tx, n int64) error {
				calls := make([]outbox.Call, callsPerManyTx)
				for i := range calls {
					calls[i] = pgonceCall(runID, n*callsPerManyTx+int64(i))
				}
				results, err := env.pgoncePgx.SubmitManyTx(ctx, tx, calls)
				if err != nil {
					return err
				}
				for _, r := range results {
					if r.Err != nil {
						return r.Err
					}
				}
				return nil
			})
		}},
		{enqueueRiver, func(runID string) txFunc {
			return pgxTx(func(ctx context.Context, tx pgx.Tx, n int64) error {
				_, err := inserter.InsertTx(ctx, tx, compareArgs{Round: runID, N: n}, nil)
				return err
			})
		}},
		{enqueueRiverUnique, func(runID string) txFunc {
			return pgxTx(func(ctx context.Context, tx pgx.Tx, n int64) error {
				_, err := inserter.InsertTx(ctx, tx, compareArgs{Round: runID, N: n}, unique)
				return err
			})
		}},
		{enqueueRiverUniqueSQL, func(runID string) txFunc {
			return sqlTx(func(ctx context.Context, tx *sql.Tx, n int64) error {
				_, err := sqlInserter.InsertTx(ctx, tx, compareArgs{Round: runID, N: n}, unique)
				return err
			})
		}},
		{enqueueRiverManyUnique, func(runID string) txFunc {
			return pgxTx(func(ctx context.Context, tx pgx.Tx, n int64) error {
				params := make([]river.InsertManyParams, callsPerManyTx)
				for i := range params {
					params[i] = river.InsertManyParams{Args: compareArgs{Round: runID, N: n*callsPerManyTx + int64(i)}, InsertOpts: unique}
				}
				_, err := inserter.InsertManyTx(ctx, tx, params)
				return err
			})
		}},
	}

	var results []result
	for _, clients := range order(env.s.enqueueClients, forward) {
		for _, v := range order(measured(env.s, variants, func(v variant) string { return v.name }), forward) {
			if err := env.truncate(ctx, env.businessTable(), env.pgonceTable(), env.riverTable()); err != nil {
				return results, err
			}
			if err := env.warm(ctx, clients); err != nil {
				return results, err
			}
			runID := fmt.Sprintf("enqueue/%d/%d/%s", round, clients, v.name)
			measured, err := env.commitBlock(ctx, clients, env.s.enqueueTx, v.tx(runID), nil)
			env.releaseIdle()
			if err != nil {
				return results, fmt.Errorf("%s, %d clients: %w", v.name, clients, err)
			}
			results = append(results, result{
				round: round, phase: phaseEnqueue, variant: v.name, clients: clients, count: env.s.enqueueTx, elapsed: measured.elapsed, walBytes: measured.walBytes, mallocs: measured.mallocs, serverCPU: measured.serverCPU, serverCPUAll: measured.serverCPUAll, clientCPU: measured.clientCPU,
			})
		}
	}
	return results, nil
}

// commitBlock runs count transactions of tx from clients goroutines, each
// taking the next number, and returns how long they took and the WAL they
// wrote. log, when not
// nil, records when each transaction's commit returned.
func (env *environment) commitBlock(ctx context.Context, clients, count int, tx txFunc, log *latencyLog) (span, error) {
	ctx, cancel := context.WithTimeout(ctx, env.s.timeout)
	defer cancel()
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	timing, err := env.startTiming(ctx)
	if err != nil {
		return span{}, err
	}
	for range clients {
		wg.Go(func() {
			for n := next.Add(1) - 1; n < int64(count); n = next.Add(1) - 1 {
				if err := tx(ctx, n); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("transaction %d: %w", n, err))
					mu.Unlock()
					cancel()
					return
				}
				if log != nil {
					log.committed(n)
				}
			}
		})
	}
	wg.Wait()
	return env.stopTiming(ctx, timing), errors.Join(errs...)
}

// warm opens clients connections in each pool before a block, so that no
// variant pays for connecting inside its timing.
func (env *environment) warm(ctx context.Context, clients int) error {
	conns := make([]*pgxpool.Conn, 0, clients)
	sqlConns := make([]*sql.Conn, 0, clients)
	defer func() {
		for _, conn := range conns {
			conn.Release()
		}
		for _, conn := range sqlConns {
			_ = conn.Close()
		}
	}()
	for range clients {
		conn, err := env.pool.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("warm the pgx pool: %w", err)
		}
		conns = append(conns, conn)
		sqlConn, err := env.db.Conn(ctx)
		if err != nil {
			return fmt.Errorf("warm the database/sql pool: %w", err)
		}
		sqlConns = append(sqlConns, sqlConn)
	}
	return nil
}

// releaseIdle closes the database/sql pool's idle connections after a
// block, so that the run holds no more of the server's connections than
// the phase at hand needs; the machine may be shared.
func (env *environment) releaseIdle() {
	env.db.SetMaxIdleConns(0)
	env.db.SetMaxIdleConns(env.s.maxConns)
}
