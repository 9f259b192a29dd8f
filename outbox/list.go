package outbox

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	"github.com/pgonce/pgonce/internal/store"
)

// Bounds of [ListParams.Limit].
const (
	// ListLimitDefault is the page size when [ListParams.Limit] is zero.
	ListLimitDefault = 100
	// ListLimitMax is the largest page [Client.List] returns.
	ListLimitMax = 1000
)

// ListWindowMax is the widest window of creation times in which
// [Client.List] lists succeeded keys and tombstones: a day. Those keys,
// nearly all of a large table, are in no index by state; a page of them
// reads the window's keys from its cursor on (through the BRIN index on
// creation time), so a day of keys is what one page may read.
const ListWindowMax = 24 * time.Hour

// ListArgsBytes is how many of a listed key's canonical arguments
// [ListedKey.Args] holds.
const ListArgsBytes = 256

// listStates are the states [Client.List] lists by default: the keys an
// operator acts on.
var listStates = []State{StatePending, StateInFlight, StateFailed, StateNeedsReview, StateCancelled}

// ListParams select the keys [Client.List] returns. The zero value lists
// every listable key, oldest first, a page of [ListLimitDefault].
type ListParams struct {
	// States are the states to list: [StatePending], [StateInFlight],
	// [StateFailed], [StateNeedsReview] and [StateCancelled], the keys an
	// operator acts on, and, within a window, [StateSucceeded] and
	// [StateExpired]. Empty means the five an operator acts on. Succeeded
	// keys and tombstones, nearly all of a large table, are listed only
	// with CreatedAfter set and a window of at most [ListWindowMax] (to
	// CreatedBefore, or now): indexing them by state would cost every
	// finished key bytes of its own, so a page of them reads the window's
	// keys from its cursor on. Read one by key with [Client.Get] or
	// [Client.Inspect], or find it with [Client.Search].
	States []State
	// Tool, Tenant and RunID, when not empty, list only keys of that tool,
	// tenant or run.
	Tool   string
	Tenant string
	RunID  string
	// CreatedAfter and CreatedBefore, when not zero, list only keys
	// created at or after CreatedAfter and before CreatedBefore.
	CreatedAfter  time.Time
	CreatedBefore time.Time
	// Limit is the most keys of one page: 1 to [ListLimitMax]. Zero means
	// [ListLimitDefault].
	Limit int
	// Cursor continues a listing where the page that returned it ended
	// ([ListResult.Cursor]); pass the same filters with it. Empty starts
	// from the oldest key.
	Cursor string
}

// ListedKey is one key of a [ListResult]: its result, without the stored
// response or failure, and the call's identity.
type ListedKey struct {
	Result
	Tenant      string
	RunID       string
	Step        int64
	BusinessKey string
	// Args are the first [ListArgsBytes] bytes of the call's canonical
	// arguments, which may end inside a character, and ArgsSize the
	// length of all of them: what the call asked, at a glance. Empty for
	// a tombstone.
	Args     []byte
	ArgsSize int
}

// ListResult is one page of [Client.List].
type ListResult struct {
	// Keys are the page's keys, oldest first (by creation, then key).
	Keys []ListedKey
	// Cursor continues the listing in [ListParams.Cursor]; empty when this
	// page is the last.
	Cursor string
}

// List returns keys by state, tool, tenant, run and creation time, oldest
// first, a page at a time: pass [ListResult.Cursor] back to get the next
// page. Pages are keyset-paginated on an index (pgonce_key_list_idx), so
// every page costs the same however large the table and however deep the
// listing: a key created while a listing runs appears in a later page if it
// sorts after the cursor. Each page is one statement; pages are not one
// snapshot. Succeeded keys and tombstones are listed within a window of
// creation times (see [ListParams.States]), read through the BRIN index on
// creation time: a page costs what the window holds from its cursor on.
//
// Only the states of [ListParams.States] are listed. It returns [ErrInvalidParams]
// for another state, a limit out of range or a cursor List did not return;
// nothing runs then.
func (c *Client[TTx]) List(ctx context.Context, params ListParams) (ListResult, error) {
	p, err := c.listParams(params)
	if err != nil {
		return ListResult{}, err
	}
	limit := p.Max
	p.Max = limit + 1 // one more tells whether another page follows
	rows, err := c.store.List(ctx, p)
	if err != nil {
		return ListResult{}, fmt.Errorf("list keys: %w", err)
	}
	var result ListResult
	if len(rows) > limit {
		rows = rows[:limit]
		last := rows[limit-1]
		result.Cursor = encodeCursor(last.CreatedAt, last.Key)
	}
	for _, row := range rows {
		result.Keys = append(result.Keys, c.listedKey(row))
	}
	return result, nil
}

func (c *Client[TTx]) listParams(params ListParams) (*store.ListParams, error) {
	p := &store.ListParams{
		Tool:           params.Tool,
		Tenant:         params.Tenant,
		RunID:          params.RunID,
		AfterCreatedAt: params.CreatedAfter,
		ArgsBytes:      ListArgsBytes,
		Max:            params.Limit,
		Now:            c.nowParam(),
	}
	if p.Max == 0 {
		p.Max = ListLimitDefault
	}
	if p.Max < 1 || p.Max > ListLimitMax {
		return nil, fmt.Errorf("%w: Limit must be between 1 and %d, got %d", ErrInvalidParams, ListLimitMax, params.Limit)
	}
	if !params.CreatedBefore.IsZero() {
		p.CreatedBefore = ptr(params.CreatedBefore)
	}
	states := params.States
	if len(states) == 0 {
		states = listStates
	}
	windowed := false
	for _, state := range states {
		switch state {
		case StatePending:
			p.Pending = true
		case StateInFlight:
			p.InFlight = true
		case StateSucceeded, StateExpired:
			windowed = true
			fallthrough
		case StateFailed, StateNeedsReview, StateCancelled:
			if !slices.Contains(p.States, string(state)) {
				p.States = append(p.States, string(state))
			}
			continue
		default:
			return nil, fmt.Errorf("%w: state %q cannot be listed; list one of %v, or succeeded and expired within a window", ErrInvalidParams, state, listStates)
		}
		if !slices.Contains(p.States, dbStateOpen) {
			p.States = append(p.States, dbStateOpen)
		}
	}
	if windowed {
		before := params.CreatedBefore
		if before.IsZero() {
			before = c.now()
		}
		switch {
		case params.CreatedAfter.IsZero():
			return nil, fmt.Errorf("%w: succeeded keys and tombstones are listed within a window: set CreatedAfter, at most %s before CreatedBefore or now", ErrInvalidParams, ListWindowMax)
		case before.Sub(params.CreatedAfter) > ListWindowMax:
			return nil, fmt.Errorf("%w: succeeded keys and tombstones are listed within a window of at most %s, got %s", ErrInvalidParams, ListWindowMax, before.Sub(params.CreatedAfter).Round(time.Second))
		}
		p.Window, p.CreatedBefore = ptr(params.CreatedAfter), ptr(before)
	}
	if params.Cursor != "" {
		createdAt, key, err := decodeCursor(params.Cursor)
		if err != nil {
			return nil, err
		}
		if createdAt.After(p.AfterCreatedAt) || createdAt.Equal(p.AfterCreatedAt) {
			p.AfterCreatedAt, p.AfterKey = createdAt, string(key)
		}
	}
	return p, nil
}

func (c *Client[TTx]) listedKey(row *store.ListedKey) ListedKey {
	// A listed key is read without its response or failure: the same
	// Result as a read of the key, less those bytes.
	res := c.resultFromRow(&store.KeyRow{
		Key:         row.Key,
		State:       row.State,
		Tool:        row.Tool,
		Attempt:     row.Attempt,
		CreatedAt:   row.CreatedAt,
		UpdatedAt:   row.UpdatedAt,
		CompletedAt: row.CompletedAt,
		LastError:   row.LastError,
		AvailableAt: row.AvailableAt,
		LeaseUntil:  row.LeaseUntil,
		Now:         row.Now,
	}, false)
	return ListedKey{
		Result: res, Tenant: row.Tenant, RunID: row.RunID, Step: row.Step, BusinessKey: row.BusinessKey,
		Args: row.ArgsHead, ArgsSize: row.ArgsSize,
	}
}

// cursorPrefix versions the cursor's text.
const cursorPrefix = "c1_"

// encodeCursor writes a position in (created_at, key) order: the creation
// time in Unix microseconds (PostgreSQL's precision) and the key.
func encodeCursor(createdAt time.Time, key string) string {
	buf := binary.BigEndian.AppendUint64(nil, uint64(createdAt.UnixMicro())) //nolint:gosec // a time's bits, read back as they were
	buf = append(buf, key...)
	return cursorPrefix + base64.RawURLEncoding.EncodeToString(buf)
}

func decodeCursor(cursor string) (time.Time, Key, error) {
	invalid := fmt.Errorf("%w: Cursor %s is not one List returned", ErrInvalidParams, quoteShort(cursor))
	if len(cursor) <= len(cursorPrefix) || cursor[:len(cursorPrefix)] != cursorPrefix {
		return time.Time{}, "", invalid
	}
	buf, err := base64.RawURLEncoding.DecodeString(cursor[len(cursorPrefix):])
	if err != nil || len(buf) < 8 {
		return time.Time{}, "", invalid
	}
	key, err := ParseKey(string(buf[8:]))
	if err != nil {
		return time.Time{}, "", invalid
	}
	micros := int64(binary.BigEndian.Uint64(buf[:8])) //nolint:gosec // written by encodeCursor
	return time.UnixMicro(micros), key, nil
}
