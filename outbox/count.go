package outbox

import (
	"context"
	"fmt"
	"time"
)

// CountCreatedMax is the most keys one [Client.CountCreated] reads: counts
// of a window that holds more are lower bounds ([CreatedCounts.Partial]).
const CountCreatedMax = 1_000_000

// CountCreatedParams select the window [Client.CountCreated] counts.
type CountCreatedParams struct {
	// CreatedAfter and CreatedBefore bound the window: keys created at or
	// after CreatedAfter (required) and before CreatedBefore (zero: no
	// end).
	CreatedAfter  time.Time
	CreatedBefore time.Time
}

// CreatedCounts is what [Client.CountCreated] counted.
type CreatedCounts struct {
	// Keys counts the window's keys per tool and state, as [Stats.Keys]
	// does: tombstones as [StateExpired] under the empty tool, and a state
	// without keys left out.
	Keys map[string]map[State]int64 `json:"keys"`
	// Partial reports that the window held more than [CountCreatedMax]
	// keys: the counts are of the first CountCreatedMax read, each a lower
	// bound.
	Partial bool `json:"partial"`
}

// CountCreated counts the keys created in a window of time per tool and
// state, in one statement that reads the window's keys through the BRIN
// index on creation time: the recent past beside [Client.Stats]'s totals.
// Its cost is the window's keys, at most [CountCreatedMax] of them.
//
// It returns [ErrInvalidParams] for a zero CreatedAfter or a window that
// ends before it begins; nothing runs then.
func (c *Client[TTx]) CountCreated(ctx context.Context, params CountCreatedParams) (CreatedCounts, error) {
	switch {
	case params.CreatedAfter.IsZero():
		return CreatedCounts{}, fmt.Errorf("%w: CreatedAfter is required", ErrInvalidParams)
	case !params.CreatedBefore.IsZero() && !params.CreatedBefore.After(params.CreatedAfter):
		return CreatedCounts{}, fmt.Errorf("%w: CreatedBefore must be after CreatedAfter", ErrInvalidParams)
	}
	var before *time.Time
	if !params.CreatedBefore.IsZero() {
		before = ptr(params.CreatedBefore)
	}
	rows, err := c.store.CountCreated(ctx, params.CreatedAfter, before, CountCreatedMax)
	if err != nil {
		return CreatedCounts{}, fmt.Errorf("count keys: %w", err)
	}
	counts := CreatedCounts{Keys: map[string]map[State]int64{}}
	var total int64
	for _, row := range rows {
		if counts.Keys[row.Tool] == nil {
			counts.Keys[row.Tool] = map[State]int64{}
		}
		counts.Keys[row.Tool][State(row.State)] = row.Keys
		total += row.Keys
	}
	counts.Partial = total >= CountCreatedMax
	return counts, nil
}
