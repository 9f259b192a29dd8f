package store

import (
	"context"
	"strings"
	"time"

	"github.com/pgonce/pgonce/internal/dbpgx"
)

// listWindow is [Store.List] over a window of creation times, through the
// BRIN index on created_at.
func (s *Store) listWindow(ctx context.Context, p *ListParams) ([]*ListedKey, error) {
	params := &dbpgx.KeyListWindowParams{
		Now:            p.Now,
		Since:          *p.Window,
		AfterCreatedAt: p.AfterCreatedAt,
		AfterKey:       []byte{},
		States:         strings.Join(p.States, ","),
		Pending:        p.Pending,
		InFlight:       p.InFlight,
		Tool:           nonEmpty(p.Tool),
		Tenant:         nonEmpty(p.Tenant),
		RunID:          nonEmpty(p.RunID),
		ArgsBytes:      int32(p.ArgsBytes), //nolint:gosec // a small constant
		MaxRows:        int32(p.Max),       //nolint:gosec // bounded by the caller
	}
	if p.CreatedBefore != nil {
		params.Before = *p.CreatedBefore
	}
	if p.AfterKey != "" {
		params.AfterKey = keyDigest(p.AfterKey)
	}
	var listed []*ListedKey
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		rows, err := q.KeyListWindow(ctx, db, params)
		for _, row := range rows {
			listed = append(listed, &ListedKey{
				Key: keyText(row.Key), State: row.State, Tenant: row.Tenant, RunID: row.RunID, Step: row.Step,
				BusinessKey: row.BusinessKey, Tool: row.Tool, Attempt: int(row.Attempt), CreatedAt: row.CreatedAt,
				UpdatedAt: row.UpdatedAt, CompletedAt: row.CompletedAt, AvailableAt: row.AvailableAt,
				LeaseUntil: row.LeaseUntil, LastError: row.LastError, ArgsHead: row.ArgsHead, ArgsSize: int(row.ArgsSize),
				Now: row.Now,
			})
		}
		return err
	})
	return listed, err
}

// SearchParams are the parameters of [Store.Search]: what to match, in
// the window from Since to Before (nil: no end) and among older listed
// keys. An empty criterion matches nothing.
type SearchParams struct {
	BusinessKey string
	NaturalID   string
	// KeyPrefix is lower-case hex digits a key begins with.
	KeyPrefix string
	// ArgsNeedle is bytes the canonical arguments contain.
	ArgsNeedle []byte
	// MetadataNeedle is bytes the stored metadata contains.
	MetadataNeedle []byte
	// Tenant, when not nil, keeps only that tenant's keys ("" for none).
	Tenant    *string
	Since     time.Time
	Before    *time.Time
	ArgsBytes int
	Max       int
	Now       *time.Time
}

// Search finds keys by p, newest first.
func (s *Store) Search(ctx context.Context, p *SearchParams) ([]*ListedKey, error) {
	params := &dbpgx.KeySearchParams{
		ArgsBytes:      int32(p.ArgsBytes), //nolint:gosec // a small constant
		ArgsNeedle:     p.ArgsNeedle,
		MetadataNeedle: p.MetadataNeedle,
		Now:            p.Now,
		Since:          p.Since,
		Before:         p.Before,
		Tenant:         p.Tenant,
		BusinessKey:    p.BusinessKey,
		NaturalID:      p.NaturalID,
		KeyPrefix:      p.KeyPrefix,
		MaxRows:        int32(p.Max), //nolint:gosec // bounded by the caller
	}
	if params.ArgsNeedle == nil {
		params.ArgsNeedle = []byte{}
	}
	if params.MetadataNeedle == nil {
		params.MetadataNeedle = []byte{}
	}
	var found []*ListedKey
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		rows, err := q.KeySearch(ctx, db, params)
		for _, row := range rows {
			found = append(found, &ListedKey{
				Key: keyText(row.Key), State: row.State, Tenant: row.Tenant, RunID: row.RunID, Step: row.Step,
				BusinessKey: row.BusinessKey, Tool: row.Tool, NaturalID: row.NaturalID, Attempt: int(row.Attempt),
				CreatedAt: row.CreatedAt, UpdatedAt: row.UpdatedAt, CompletedAt: row.CompletedAt,
				AvailableAt: row.AvailableAt, LeaseUntil: row.LeaseUntil, LastError: row.LastError,
				ArgsHead: row.ArgsHead, ArgsSize: int(row.ArgsSize), ArgsMatched: row.ArgsMatched,
				MetadataMatched: row.MetadataMatched, Now: row.Now,
			})
		}
		return err
	})
	return found, err
}

// SearchByNaturalID finds the keys of a natural id, of any age, newest
// first, on the natural id's index; tenant, when not nil, keeps only its
// keys.
func (s *Store) SearchByNaturalID(ctx context.Context, naturalID string, tenant *string, argsBytes, maxRows int, now *time.Time) ([]*ListedKey, error) {
	var found []*ListedKey
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		rows, err := q.KeySearchByNaturalID(ctx, db, &dbpgx.KeySearchByNaturalIDParams{
			ArgsBytes: int32(argsBytes), //nolint:gosec // a small constant
			Now:       now,
			NaturalID: naturalID,
			Tenant:    tenant,
			MaxRows:   int32(maxRows), //nolint:gosec // bounded by the caller
		})
		for _, row := range rows {
			found = append(found, &ListedKey{
				Key: keyText(row.Key), State: row.State, Tenant: row.Tenant, RunID: row.RunID, Step: row.Step,
				BusinessKey: row.BusinessKey, Tool: row.Tool, NaturalID: row.NaturalID, Attempt: int(row.Attempt),
				CreatedAt: row.CreatedAt, UpdatedAt: row.UpdatedAt, CompletedAt: row.CompletedAt,
				AvailableAt: row.AvailableAt, LeaseUntil: row.LeaseUntil, LastError: row.LastError,
				ArgsHead: row.ArgsHead, ArgsSize: int(row.ArgsSize), Now: row.Now,
			})
		}
		return err
	})
	return found, err
}

// RunTenant is a tenant that has keys of a run, for [Store.RunTenants].
type RunTenant struct {
	Tenant string
	Keys   int64
}

// RunTenants returns the tenants that have keys of runID created from since
// to before (nil: no end), or older and listed.
func (s *Store) RunTenants(ctx context.Context, runID string, since time.Time, before *time.Time, maxRows int) ([]RunTenant, error) {
	var tenants []RunTenant
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		rows, err := q.KeySearchRunTenants(ctx, db, &dbpgx.KeySearchRunTenantsParams{
			Since:   since,
			Before:  before,
			RunID:   runID,
			MaxRows: int32(maxRows), //nolint:gosec // bounded by the caller
		})
		for _, row := range rows {
			tenants = append(tenants, RunTenant{Tenant: row.Tenant, Keys: row.Keys})
		}
		return err
	})
	return tenants, err
}

// CountCreated counts the keys created from since to before (nil: no
// end) per tool and state, reading at most maxRows keys.
func (s *Store) CountCreated(ctx context.Context, since time.Time, before *time.Time, maxRows int) ([]*StateCount, error) {
	var counts []*StateCount
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		rows, err := q.KeyCountCreated(ctx, db, &dbpgx.KeyCountCreatedParams{
			Since:   since,
			Before:  before,
			MaxRows: int32(maxRows), //nolint:gosec // bounded by the caller
		})
		for _, row := range rows {
			counts = append(counts, &StateCount{Tool: row.Tool, State: row.State, Keys: row.Keys})
		}
		return err
	})
	return counts, err
}

// KeyDetails is what an inspection reads beside the key: see
// [Store.KeyDetails].
type KeyDetails struct {
	Args             []byte
	FirstAttemptedAt *time.Time
	// ExpiredState is a tombstone's final state; empty for other keys.
	ExpiredState string
}

// KeyDetails reads key's canonical arguments, first attempt time and, for
// a tombstone, its final state. It returns [ErrNoRows] for an unknown key.
func (s *Store) KeyDetails(ctx context.Context, key string) (*KeyDetails, error) {
	var details *KeyDetails
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		row, err := q.KeyGetDetails(ctx, db, &dbpgx.KeyGetDetailsParams{Key: keyDigest(key)})
		if err != nil {
			return err
		}
		details = &KeyDetails{Args: row.Args, FirstAttemptedAt: row.FirstAttemptedAt, ExpiredState: row.ExpiredState}
		return nil
	})
	return details, err
}

// Args returns the canonical arguments of key; a tombstone's are empty. It
// returns [ErrNoRows] for an unknown key.
func (s *Store) Args(ctx context.Context, key string) ([]byte, error) {
	details, err := s.KeyDetails(ctx, key)
	if err != nil {
		return nil, err
	}
	return details.Args, nil
}
