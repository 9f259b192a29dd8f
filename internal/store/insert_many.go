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
// driver, which takes any value pgx does.
func keyInsertManyParams(p *InsertManyParams) *dbpgx.KeyInsertManyParams {
	n := len(p.Keys)
	var (
		keys, scopes, fingerprints, args, metadata    = make([][]byte, n), make([][]byte, n), make([][]byte, n), make([][]byte, n), make([][]byte, n)
		tenants, runIDs, businessKeys, tools, natural = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		steps                                         = make([]int64, n)
		deliveries                                    = make([]*int16, n)
		retentions, delays                            = make([]*int64, n), make([]*int64, n)
		notBefore                                     = make([]*time.Time, n)
	)
	for i, k := range p.Keys {
		one := keyInsertParams(k)
		keys[i], scopes[i], fingerprints[i], args[i], metadata[i] = one.Key, one.Scope, one.Fingerprint, one.Args, one.Metadata
		tenants[i], runIDs[i], businessKeys[i], tools[i], natural[i] = one.Tenant, one.RunID, one.BusinessKey, one.Tool, one.NaturalID
		steps[i], deliveries[i], retentions[i], delays[i], notBefore[i] = one.Step, one.Delivery, one.KeyRetentionMs, one.DelayMs, one.NotBefore
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
		NaturalIDs:     natural,
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
