package store

import (
	"context"
	"time"

	"github.com/pgonce/pgonce/internal/dbpgx"
)

// ListByScopeParams are the parameters of [Store.ListByScope].
type ListByScopeParams struct {
	// AfterScope is the scope (its 32 bytes) the page starts after; empty
	// starts from the first.
	AfterScope []byte
	// ChangedSince, when not nil, keeps only the keys created or changed at
	// or after it.
	ChangedSince *time.Time
	Max          int
	Now          *time.Time
}

// ListByScope returns up to Max keys that are not tombstones in scope order,
// after p.AfterScope, and the scope of each. The keys' ArgsHead is empty.
func (s *Store) ListByScope(ctx context.Context, p *ListByScopeParams) ([]*ListedKey, [][]byte, error) {
	var (
		listed []*ListedKey
		scopes [][]byte
	)
	after := p.AfterScope
	if after == nil {
		after = []byte{}
	}
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		rows, err := q.KeyListByScope(ctx, db, &dbpgx.KeyListByScopeParams{
			Now:          p.Now,
			AfterScope:   after,
			ChangedSince: p.ChangedSince,
			MaxRows:      int32(p.Max), //nolint:gosec // bounded by the caller
		})
		for _, row := range rows {
			listed = append(listed, listedKeyFromScoped((*dbpgx.KeyListByKeysRow)(row)))
			scopes = append(scopes, row.Scope)
		}
		return err
	})
	return listed, scopes, err
}

// ListByKeys reads keys, given in their text form, in one statement; a key
// the table lacks is not in the result. The keys' ArgsHead is empty.
func (s *Store) ListByKeys(ctx context.Context, keys []string) ([]*ListedKey, error) {
	digests := make([][]byte, 0, len(keys))
	for _, key := range keys {
		if digest := keyDigest(key); digest != nil {
			digests = append(digests, digest)
		}
	}
	var listed []*ListedKey
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		rows, err := q.KeyListByKeys(ctx, db, &dbpgx.KeyListByKeysParams{Keys: digests})
		for _, row := range rows {
			listed = append(listed, listedKeyFromScoped(row))
		}
		return err
	})
	return listed, err
}

func listedKeyFromScoped(row *dbpgx.KeyListByKeysRow) *ListedKey {
	return &ListedKey{
		Key: keyText(row.Key), State: row.State, Tenant: row.Tenant, RunID: row.RunID, Step: row.Step,
		BusinessKey: row.BusinessKey, Tool: row.Tool, Attempt: int(row.Attempt), CreatedAt: row.CreatedAt,
		UpdatedAt: row.UpdatedAt, CompletedAt: row.CompletedAt, AvailableAt: row.AvailableAt,
		LeaseUntil: row.LeaseUntil, LastError: row.LastError, Now: row.Now,
	}
}
