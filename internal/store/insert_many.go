package store

import (
	"encoding/json"
	"fmt"
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

// newKeyJSON is one element of KeyInsertMany's calls: []byte values encode
// as base64, which the statement decodes.
type newKeyJSON struct {
	Key          []byte     `json:"key"`
	Scope        []byte     `json:"scope"`
	Tenant       string     `json:"tenant"`
	RunID        string     `json:"run_id"`
	Step         int64      `json:"step"`
	BusinessKey  string     `json:"business_key"`
	Tool         string     `json:"tool"`
	NaturalID    string     `json:"natural_id"`
	Fingerprint  []byte     `json:"fingerprint"`
	Args         []byte     `json:"args"`
	Metadata     []byte     `json:"metadata"`
	Delivery     *int16     `json:"delivery"`
	KeyRetention *int64     `json:"key_retention_ms"`
	NotBefore    *time.Time `json:"not_before"`
	DelayMs      *int64     `json:"delay_ms"`
}

// keyInsertManyParams encodes p as KeyInsertMany's parameters, with the
// conversions of keyInsertParams.
func keyInsertManyParams(p *InsertManyParams) (*dbpgx.KeyInsertManyParams, error) {
	calls := make([]newKeyJSON, len(p.Keys))
	for i, k := range p.Keys {
		one := keyInsertParams(k)
		calls[i] = newKeyJSON{
			Key:          one.Key,
			Scope:        one.Scope,
			Tenant:       one.Tenant,
			RunID:        one.RunID,
			Step:         one.Step,
			BusinessKey:  one.BusinessKey,
			Tool:         one.Tool,
			NaturalID:    one.NaturalID,
			Fingerprint:  one.Fingerprint,
			Args:         one.Args,
			Metadata:     one.Metadata,
			Delivery:     one.Delivery,
			KeyRetention: one.KeyRetentionMs,
			NotBefore:    one.NotBefore,
			DelayMs:      one.DelayMs,
		}
	}
	encoded, err := json.Marshal(calls)
	if err != nil {
		return nil, fmt.Errorf("encode keys: %w", err)
	}
	return &dbpgx.KeyInsertManyParams{Now: p.Now, Calls: string(encoded), Channel: p.Channel}, nil
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
