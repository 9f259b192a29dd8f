package store

import (
	"context"
	"strings"
	"time"

	"github.com/pgonce/pgonce/internal/dbpgx"
)

// ListParams are the parameters of [Store.List].
type ListParams struct {
	// States are stored states, StateOpen included; never StateSucceeded or
	// StateExpired, which the list index leaves out.
	States []string
	// Pending and InFlight select which open keys StateOpen lists.
	Pending  bool
	InFlight bool
	// Tool, Tenant and RunID filter when not empty.
	Tool   string
	Tenant string
	RunID  string
	// AfterCreatedAt and AfterKey are the cursor: only keys after them in
	// (created_at, key) order are listed. An empty AfterKey with
	// AfterCreatedAt t lists keys created at t or later.
	AfterCreatedAt time.Time
	AfterKey       string
	// CreatedBefore, when set, lists only keys created before it.
	CreatedBefore *time.Time
	// Window, when set, lists the keys created from Window to
	// CreatedBefore (required then) through the BRIN index on created_at,
	// and States may hold StateSucceeded and StateExpired.
	Window *time.Time
	// ArgsBytes is how many of the arguments' first bytes each key comes
	// with.
	ArgsBytes int
	Max       int
	Now       *time.Time
}

// ListedKey is one key of [Store.List].
type ListedKey struct {
	Key         string
	State       string
	Tenant      string
	RunID       string
	Step        int64
	BusinessKey string
	Tool        string
	Attempt     int
	CreatedAt   time.Time
	UpdatedAt   time.Time
	CompletedAt *time.Time
	AvailableAt time.Time
	LeaseUntil  *time.Time
	LastError   *string
	// NaturalID is set by the searches alone.
	NaturalID string
	// ArgsHead are the arguments' first bytes, ArgsSize their length.
	ArgsHead []byte
	ArgsSize int
	// ArgsMatched reports that a search found its text in the arguments.
	ArgsMatched bool
	// MetadataMatched reports that a search found its text in the
	// metadata.
	MetadataMatched bool
	// Now is the database's clock at the read.
	Now time.Time
}

// List returns up to Max keys in the given states, in (created_at, key)
// order, from the cursor on.
func (s *Store) List(ctx context.Context, p *ListParams) ([]*ListedKey, error) {
	if p.Window != nil {
		return s.listWindow(ctx, p)
	}
	params := &dbpgx.KeyListParams{
		Now:            p.Now,
		States:         strings.Join(p.States, ","),
		AfterCreatedAt: p.AfterCreatedAt,
		AfterKey:       []byte{},
		CreatedBefore:  p.CreatedBefore,
		Pending:        p.Pending,
		InFlight:       p.InFlight,
		Tool:           nonEmpty(p.Tool),
		Tenant:         nonEmpty(p.Tenant),
		RunID:          nonEmpty(p.RunID),
		ArgsBytes:      int32(p.ArgsBytes), //nolint:gosec // a small constant
		MaxRows:        int32(p.Max),       //nolint:gosec // bounded by the caller
	}
	if p.AfterKey != "" {
		params.AfterKey = keyDigest(p.AfterKey)
	}
	var listed []*ListedKey
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		rows, err := q.KeyList(ctx, db, params)
		for _, row := range rows {
			listed = append(listed, &ListedKey{
				Key:         keyText(row.Key),
				State:       row.State,
				Tenant:      row.Tenant,
				RunID:       row.RunID,
				Step:        row.Step,
				BusinessKey: row.BusinessKey,
				Tool:        row.Tool,
				Attempt:     int(row.Attempt),
				CreatedAt:   row.CreatedAt,
				UpdatedAt:   row.UpdatedAt,
				CompletedAt: row.CompletedAt,
				AvailableAt: row.AvailableAt,
				LeaseUntil:  row.LeaseUntil,
				LastError:   row.LastError,
				ArgsHead:    row.ArgsHead,
				ArgsSize:    int(row.ArgsSize),
				Now:         row.Now,
			})
		}
		return err
	})
	return listed, err
}

// AuditParams are the parameters of [Store.Cancel] and [Store.Retry]: who
// acts on which key, and why.
type AuditParams struct {
	Key        string
	ResolvedBy string
	Reason     string
	// Retention and TombstoneRetention start a cancelled key's retention;
	// Retry ignores them.
	Retention          time.Duration
	TombstoneRetention time.Duration
	// Channel, when not empty, is notified: with the key for a cancel, for
	// dispatchers for a retry.
	Channel string
	Now     *time.Time
}

// Cancel cancels a pending key and records who did it and why. It returns
// [ErrNoRows] when the key is not pending.
func (s *Store) Cancel(ctx context.Context, p *AuditParams) error {
	return s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		_, err := q.KeyCancel(ctx, db, &dbpgx.KeyCancelParams{
			Key:         keyDigest(p.Key),
			Now:         p.Now,
			RetentionMs: p.Retention.Milliseconds(),
			TombstoneMs: p.TombstoneRetention.Milliseconds(),
			ResolvedBy:  p.ResolvedBy,
			Reason:      p.Reason,
			Channel:     p.Channel,
		})
		return err
	})
}

// Retry sends a failed or cancelled key back to pending, due now, and
// records who did it and why. It returns [ErrNoRows] when the key is in any
// other state.
func (s *Store) Retry(ctx context.Context, p *AuditParams) error {
	return s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		_, err := q.KeyRetry(ctx, db, &dbpgx.KeyRetryParams{
			Key:        keyDigest(p.Key),
			Now:        p.Now,
			ResolvedBy: p.ResolvedBy,
			Reason:     p.Reason,
			Channel:    p.Channel,
		})
		return err
	})
}

func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// KeysByScope reads the keys of scopes, given in their hex form, in one
// statement that looks each up on the scope's unique index; a scope without
// a key has no row. now, when not nil, replaces the database's clock.
func (s *Store) KeysByScope(ctx context.Context, scopes []string, now *time.Time) ([]*KeyRow, error) {
	var keys []*KeyRow
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		rows, err := q.KeyGetByScopes(ctx, db, &dbpgx.KeyGetByScopesParams{Scopes: strings.Join(scopes, ","), Now: now})
		for _, row := range rows {
			keys = append(keys, keyRowFromGet((*dbpgx.KeyGetRow)(row)))
		}
		return err
	})
	return keys, err
}
