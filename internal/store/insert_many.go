package store

import (
	"time"

	"github.com/pgonce/pgonce/internal/dbpgx"
)

// InsertManyParams are the parameters of [Executor.KeyInsertMany].
type InsertManyParams struct {
	// Keys are inserted pending, in this order; Lease, Worker,
	// ReplicatedClaim, Channel and Now of each are ignored.
	Keys []*NewKey
	// Channel, when not empty, is notified once when any key is inserted.
	Channel string
	// Now replaces the database's clock when not nil.
	Now *time.Time
}

// keyInsertManyParams encodes p as KeyInsertMany's parameters, one slice
// per column, with the conversions of keyInsertParams. Both drivers send
// the slices as arrays: pgx natively, database/sql through pgx's stdlib
// driver, which takes any value pgx does. An optional column that no key
// sets (no tenant, no schedule, ...: most batches) stays a nil slice, sent
// as NULL, which the statement reads as NULL for every key, so that
// neither side encodes or decodes an array of nothing.
func keyInsertManyParams(p *InsertManyParams) *dbpgx.KeyInsertManyParams {
	n := len(p.Keys)
	var (
		keys, scopes, args                = make([][]byte, n), make([][]byte, n), make([][]byte, n)
		runIDs, tools                     = make([]string, n), make([]string, n)
		steps                             = make([]int64, n)
		fingerprints, metadata            [][]byte
		tenants, businessKeys, naturalIDs []string
		deliveries                        []*int16
		retentions, delays                []*int64
		notBefore                         []*time.Time
	)
	for i, k := range p.Keys {
		one := keyInsertParams(k)
		keys[i], scopes[i], args[i], runIDs[i], tools[i], steps[i] = one.Key, one.Scope, one.Args, one.RunID, one.Tool, one.Step
		fingerprints = sparse(fingerprints, n, i, one.Fingerprint, one.Fingerprint == nil)
		metadata = sparse(metadata, n, i, one.Metadata, one.Metadata == nil)
		tenants = sparse(tenants, n, i, one.Tenant, one.Tenant == "")
		businessKeys = sparse(businessKeys, n, i, one.BusinessKey, one.BusinessKey == "")
		naturalIDs = sparse(naturalIDs, n, i, one.NaturalID, one.NaturalID == "")
		deliveries = sparse(deliveries, n, i, one.Delivery, one.Delivery == nil)
		retentions = sparse(retentions, n, i, one.KeyRetentionMs, one.KeyRetentionMs == nil)
		delays = sparse(delays, n, i, one.DelayMs, one.DelayMs == nil)
		notBefore = sparse(notBefore, n, i, one.NotBefore, one.NotBefore == nil)
	}
	return &dbpgx.KeyInsertManyParams{
		Now:            p.Now,
		Keys:           keys,
		Scopes:         scopes,
		Tenants:        tenants,
		RunIDs:         runIDs,
		Steps:          steps,
		BusinessKeys:   businessKeys,
		Tools:          tools,
		NaturalIDs:     naturalIDs,
		Fingerprints:   fingerprints,
		Args:           args,
		Metadata:       metadata,
		Deliveries:     deliveries,
		KeyRetentionMs: retentions,
		NotBefore:      notBefore,
		DelayMs:        delays,
		Channel:        p.Channel,
	}
}

// sparse sets element i of column, which has n elements once made, to
// value, unless value is the column's NULL (or, for text, empty) value:
// column is made at its first other value, and stays nil without one.
func sparse[T any](column []T, n, i int, value T, null bool) []T {
	if null {
		return column
	}
	if column == nil {
		column = make([]T, n)
	}
	column[i] = value
	return column
}

func insertedKeys(rows []*dbpgx.KeyInsertManyRow) []*InsertedKey {
	inserted := make([]*InsertedKey, len(rows))
	for i, row := range rows {
		inserted[i] = &InsertedKey{
			Key:         keyText(row.Key),
			CreatedAt:   row.CreatedAt,
			AvailableAt: row.AvailableAt,
			Now:         row.Now,
		}
	}
	return inserted
}
