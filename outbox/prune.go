package outbox

import (
	"context"
	"fmt"
	"math"
	"time"
)

// PruneBatchSizeDefault is how many rows one prune statement handles.
const PruneBatchSizeDefault = 1000

// PruneOpts are optional settings of [Client.Prune].
type PruneOpts struct {
	// DryRun counts what would be pruned and changes nothing.
	DryRun bool
	// BatchSize is how many rows one statement deletes. Defaults to
	// [PruneBatchSizeDefault]; zero or negative means the default, and sizes
	// above math.MaxInt32 are treated as math.MaxInt32.
	BatchSize int
	// ProgressFunc, when set, is called after every batch with the totals
	// so far.
	ProgressFunc func(PruneResult)
}

// PruneResult counts what [Client.Prune] did, or would do in a dry run.
type PruneResult struct {
	// Keys counts finished keys past their retention turned into
	// tombstones.
	Keys int64 `json:"keys"`
	// Tombstones counts tombstones past their horizon deleted.
	Tombstones int64 `json:"tombstones"`
}

// Prune applies retention. Finished keys (succeeded or failed) whose
// retention ended lose their response and arguments and become tombstones
// that keep the key, its scope and its completion time until the tombstone
// horizon fixed when the key finished ([Config.TombstoneRetention] of the
// client that recorded it); tombstones past that horizon are deleted. A
// tombstone keeps the key's row and unique index entries, so a duplicate
// that races with pruning conflicts with it and never runs. Pending, in-flight
// and needs-review keys are never touched. A submit, Do or Get of a
// tombstoned key returns [ErrExpired] and nothing runs again.
//
// Work is done in batches of short statements that skip rows locked by
// others, each under [Config.StatementTimeout], so Prune holds no long locks,
// rewrites no table, and may run beside dispatchers and other pruners. A dry
// run's counts, an operator's read, run under ctx alone. Retention is fixed
// when a key finishes, from its tool's [ToolOpts.Retention] or
// [Config.Retention].
func (c *Client[TTx]) Prune(ctx context.Context, opts *PruneOpts) (PruneResult, error) {
	if c.observer == nil {
		return c.prune(ctx, opts)
	}
	ctx, end := c.observer.StartPrune(ctx, opts != nil && opts.DryRun)
	res, err := c.prune(ctx, opts)
	end(res.Keys, res.Tombstones, err)
	return res, err
}

func (c *Client[TTx]) prune(ctx context.Context, opts *PruneOpts) (PruneResult, error) {
	if opts == nil {
		opts = &PruneOpts{}
	}
	batch := opts.BatchSize
	if batch <= 0 {
		batch = PruneBatchSizeDefault
	}
	// A statement's LIMIT is a 32-bit integer.
	batch = min(batch, math.MaxInt32)
	var result PruneResult
	if opts.DryRun {
		keys, err := c.store.CountExpirable(ctx, c.nowParam())
		if err != nil {
			return result, fmt.Errorf("count expired keys: %w", err)
		}
		tombstones, err := c.store.CountForgettable(ctx, c.nowParam())
		if err != nil {
			return result, fmt.Errorf("count expired tombstones: %w", err)
		}
		return PruneResult{Keys: keys, Tombstones: tombstones}, nil
	}
	for {
		expired, err := c.pruneBatch(ctx, batch, c.store.Expire)
		if err != nil {
			return result, fmt.Errorf("prune keys: %w", err)
		}
		result.Keys += expired
		if opts.ProgressFunc != nil && expired > 0 {
			opts.ProgressFunc(result)
		}
		if expired < int64(batch) {
			break
		}
	}
	for {
		pruned, err := c.pruneBatch(ctx, batch, c.store.Forget)
		if err != nil {
			return result, fmt.Errorf("prune tombstones: %w", err)
		}
		result.Tombstones += pruned
		if opts.ProgressFunc != nil && pruned > 0 {
			opts.ProgressFunc(result)
		}
		if pruned < int64(batch) {
			break
		}
	}
	return result, nil
}

// pruneBatch runs op, one batch's statement, under
// [Config.StatementTimeout].
func (c *Client[TTx]) pruneBatch(ctx context.Context, batch int, op func(context.Context, int, *time.Time) (int64, error)) (int64, error) {
	ctx, cancel := c.statementContext(ctx)
	defer cancel()
	return op(ctx, batch, c.nowParam())
}
