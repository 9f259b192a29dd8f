package outbox

import (
	"context"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/pgonce/pgonce/internal/store"
)

// Bounds of [FailoverDiffParams.Limit].
const (
	// FailoverDiffLimitDefault is how many keys of the old primary a page
	// of [FailoverDiff] compares when [FailoverDiffParams.Limit] is zero.
	FailoverDiffLimitDefault = 1000
	// FailoverDiffLimitMax is the most keys a page of [FailoverDiff]
	// compares.
	FailoverDiffLimitMax = 10000
)

// FailoverDiffParams select the keys of the old primary that [FailoverDiff]
// compares. The zero value compares every key, [FailoverDiffLimitDefault]
// a page.
type FailoverDiffParams struct {
	// ChangedSince, when not zero, compares only the keys the old primary
	// created or changed at or after it: a time safely before the last WAL
	// the new primary received (its promotion, less the replication lag the
	// failover manager allowed) narrows the comparison to what a failover
	// can have lost. Zero compares every key.
	ChangedSince time.Time
	// Limit is the most keys of the old primary one page compares: 1 to
	// [FailoverDiffLimitMax]. Zero means [FailoverDiffLimitDefault].
	Limit int
	// Cursor continues where the page that returned it ended
	// ([FailoverDiffResult.Cursor]); pass the same ChangedSince with it.
	// Empty starts from the first key.
	Cursor string
}

// FailoverDiffKey is a key that the old primary holds and the new one lacks
// or holds in another state or after another number of attempts.
type FailoverDiffKey struct {
	// Old is the key on the old primary (without its response, failure or
	// arguments).
	Old ListedKey
	// New is the key on the new primary; nil when it lacks the key.
	New *ListedKey
	// Acted reports that the old primary counted an attempt of the key
	// (Old.Attempts > 0): its provider may have been called, whatever the
	// new primary knows of it. A key that never acted can be submitted
	// again as it was; one that acted is resubmitted safely only to a
	// provider that deduplicates on its key, and otherwise resolved by
	// someone who checked what the provider did.
	Acted bool
}

// Missing reports that the new primary lacks the key.
func (k FailoverDiffKey) Missing() bool { return k.New == nil }

// FailoverDiffResult is one page of [FailoverDiff].
type FailoverDiffResult struct {
	// Keys are the keys of the page that differ, in the old primary's
	// scope order.
	Keys []FailoverDiffKey
	// Compared counts the keys of the old primary the page compared.
	Compared int
	// Cursor continues the comparison with the next page; empty after the
	// last one.
	Cursor string
}

// failoverCursorPrefix versions [FailoverDiffResult.Cursor]'s text.
const failoverCursorPrefix = "f1_"

// FailoverDiff compares the keys of oldPrimary, a client of the primary a
// failover left behind, with those of newPrimary, a client of the promoted
// standby, a page at a time: it returns the keys oldPrimary holds (its
// tombstones apart) that newPrimary lacks, or holds in another state or
// after another number of attempts. With asynchronous replication these
// are the commits the standby never received; some acted (see
// [FailoverDiffKey.Acted]). Read them before the old primary is rewound
// (pg_rewind) or rebuilt, which discards them.
//
// FailoverDiff only reads: the old primary may run read-only
// (default_transaction_read_only, or a server restored from a dump). Each
// page is two statements, one on each primary, and pages are not one
// snapshot; keys are read in scope order, on the scope's unique index.
// It returns [ErrInvalidParams] for a limit out of range or a cursor it
// did not return, before any statement runs.
func FailoverDiff[TOld, TNew any](ctx context.Context, oldPrimary *Client[TOld], newPrimary *Client[TNew], params FailoverDiffParams) (FailoverDiffResult, error) {
	if oldPrimary == nil || newPrimary == nil {
		return FailoverDiffResult{}, fmt.Errorf("%w: FailoverDiff needs a client of the old primary and one of the new", ErrInvalidParams)
	}
	limit := params.Limit
	if limit == 0 {
		limit = FailoverDiffLimitDefault
	}
	if limit < 1 || limit > FailoverDiffLimitMax {
		return FailoverDiffResult{}, fmt.Errorf("%w: Limit must be between 1 and %d, got %d", ErrInvalidParams, FailoverDiffLimitMax, params.Limit)
	}
	p := &store.ListByScopeParams{Max: limit + 1, Now: oldPrimary.nowParam()}
	if !params.ChangedSince.IsZero() {
		p.ChangedSince = ptr(params.ChangedSince)
	}
	if params.Cursor != "" {
		scope, err := decodeFailoverCursor(params.Cursor)
		if err != nil {
			return FailoverDiffResult{}, err
		}
		p.AfterScope = scope
	}
	rows, scopes, err := oldPrimary.store.ListByScope(ctx, p)
	if err != nil {
		return FailoverDiffResult{}, fmt.Errorf("list keys of the old primary: %w", err)
	}
	var result FailoverDiffResult
	if len(rows) > limit {
		// One more row than the page says that another page follows.
		rows = rows[:limit]
		result.Cursor = failoverCursorPrefix + hex.EncodeToString(scopes[limit-1])
	}
	result.Compared = len(rows)
	if len(rows) == 0 {
		return result, nil
	}
	keys := make([]string, 0, len(rows))
	for _, row := range rows {
		keys = append(keys, row.Key)
	}
	found, err := newPrimary.store.ListByKeys(ctx, keys)
	if err != nil {
		return FailoverDiffResult{}, fmt.Errorf("read keys of the new primary: %w", err)
	}
	onNew := make(map[string]*store.ListedKey, len(found))
	for _, row := range found {
		onNew[row.Key] = row
	}
	for _, row := range rows {
		old := oldPrimary.listedKey(row)
		diff := FailoverDiffKey{Old: old, Acted: old.Attempts > 0}
		if newRow, ok := onNew[row.Key]; ok {
			newKey := newPrimary.listedKey(newRow)
			if newKey.State == old.State && newKey.Attempts == old.Attempts {
				continue
			}
			diff.New = &newKey
		}
		result.Keys = append(result.Keys, diff)
	}
	return result, nil
}

func decodeFailoverCursor(cursor string) ([]byte, error) {
	digest, ok := strings.CutPrefix(cursor, failoverCursorPrefix)
	scope, err := hex.DecodeString(digest)
	if !ok || err != nil || len(scope) != 32 {
		return nil, fmt.Errorf("%w: Cursor %s is not one FailoverDiff returned", ErrInvalidParams, quoteShort(cursor))
	}
	return scope, nil
}
