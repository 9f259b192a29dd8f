package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// errQueued is what a statement run on a [batchQueue] returns: the
// statement was queued, not run.
var errQueued = errors.New("statement queued in a batch")

// batchQueue is a dbpgx.DBTX that queues the statements given to it in a
// batch instead of running them, so that the generated functions can build
// a pipeline: call each on a batchQueue (it returns errQueued), send the
// batch, then call the same functions in the same order on a [batchReplay]
// of its results, which scan them. A pipeline sent outside a transaction
// runs in one implicit transaction, committed after its last statement, and
// in READ COMMITTED each of its statements takes its snapshot when it
// starts, after the statements before it ended.
type batchQueue struct {
	batch *pgx.Batch
}

func (q batchQueue) Exec(_ context.Context, query string, args ...any) (pgconn.CommandTag, error) {
	q.batch.Queue(query, args...)
	return pgconn.CommandTag{}, errQueued
}

func (q batchQueue) Query(_ context.Context, query string, args ...any) (pgx.Rows, error) {
	q.batch.Queue(query, args...)
	return nil, errQueued
}

func (q batchQueue) QueryRow(_ context.Context, query string, args ...any) pgx.Row {
	q.batch.Queue(query, args...)
	return queuedRow{}
}

// queuedRow is the row of a statement queued in a batch.
type queuedRow struct{}

func (queuedRow) Scan(...any) error { return errQueued }

// batchReplay is a dbpgx.DBTX that answers each statement given to it with
// the next result of a batch sent, whatever the statement's text: the
// statements must come in the order they were queued (see [batchQueue]).
type batchReplay struct {
	results pgx.BatchResults
}

func (r batchReplay) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return r.results.Exec()
}

func (r batchReplay) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return r.results.Query()
}

func (r batchReplay) QueryRow(context.Context, string, ...any) pgx.Row {
	return r.results.QueryRow()
}

// queued reports whether err is what queueing a statement returns, and
// nothing else.
func queued(err error) bool { return errors.Is(err, errQueued) }
