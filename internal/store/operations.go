package store

import (
	"cmp"
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgonce/pgonce/internal/dbpgx"
)

// NewKey is a key claim for [Executor.KeyInsert]. Keys and scopes are passed
// in their text form.
type NewKey struct {
	Key         string
	Scope       string
	Tenant      string
	RunID       string
	Step        int64
	BusinessKey string
	Tool        string
	NaturalID   string
	Fingerprint string
	Args        []byte
	// Metadata is the call's data outside the key, stored as given; nil
	// stores NULL.
	Metadata []byte
	// Delivery is one of the Delivery constants, and KeyRetention the
	// provider's key retention (zero: never forgets), as the tool had them
	// at submit.
	Delivery     Delivery
	KeyRetention time.Duration
	// NotBefore and Delay, when set, make a pending key due no earlier than
	// NotBefore and no earlier than Delay after the insert.
	NotBefore *time.Time
	Delay     time.Duration
	// Lease, when positive, claims the new key in flight at once for Worker
	// (the inline path); otherwise the key is pending.
	Lease  time.Duration
	Worker string
	// ReplicatedClaim, with Lease, makes the insert commit only once the
	// synchronous standbys applied it.
	ReplicatedClaim bool
	// Channel, when not empty, is notified when the key is inserted pending.
	Channel string
	// Now replaces the database's clock when not nil.
	Now *time.Time
}

// InsertedKey is what [Executor.KeyInsert] and [Executor.KeyInsertMany]
// return for a key they inserted.
type InsertedKey struct {
	// Key is set by [Executor.KeyInsertMany] alone.
	Key       string
	CreatedAt time.Time
	// AvailableAt is when the key is due.
	AvailableAt time.Time
	Attempt     int
	// LeaseUntil is set when the key was claimed in flight.
	LeaseUntil *time.Time
	// Now is the database's clock at the insert.
	Now time.Time
}

// KeyRow is a key as read by [Executor.KeyGet] and
// [Executor.KeyGetByKeyOrScope].
type KeyRow struct {
	Key         string
	Scope       string
	Tenant      string
	RunID       string
	Step        int64
	BusinessKey string
	Tool        string
	NaturalID   string
	Fingerprint string
	State       string
	Attempt     int
	Response    []byte
	Failure     []byte
	CreatedAt   time.Time
	UpdatedAt   time.Time
	CompletedAt *time.Time
	ExpiresAt   *time.Time
	LastError   *string
	AvailableAt time.Time
	LeaseUntil  *time.Time
	// Metadata is the call's stored metadata, nil when it had none.
	Metadata []byte
	// Delivery and KeyRetention are the tool's settings at submit.
	Delivery     Delivery
	KeyRetention time.Duration
	// Now is the database's clock at the read.
	Now time.Time
}

// ClaimedKey is a key claimed in flight by [Store.ClaimBatch],
// [Store.ClaimKey] or [Store.ReclaimExpired].
type ClaimedKey struct {
	Key string
	// Scope is the key's scope, in its text form: the statements that
	// record the attempt's outcome find the key's row by it (see
	// [Outcome]). Unset for a key of ClaimKey, whose caller knows it.
	Scope   string
	Tool    string
	Attempt int
	// Ambiguous reports that an earlier attempt may have acted. A reclaimed
	// key is always ambiguous.
	Ambiguous        bool
	FirstAttemptedAt time.Time
	// LeaseUntil is unset for a reclaimed key.
	LeaseUntil time.Time
	// NaturalID and Args are unset for a key of ClaimKey.
	NaturalID string
	Args      []byte
	Metadata  []byte
	// Delivery and KeyRetention, the tool's settings at submit, are set for
	// a reclaimed key only.
	Delivery     Delivery
	KeyRetention time.Duration
	// AvailableAt is when the key became due; set by ClaimBatch only.
	AvailableAt time.Time
	// Now is the database's clock at the claim.
	Now time.Time
}

// ClaimBatchParams are the parameters of [Store.ClaimBatch].
type ClaimBatchParams struct {
	Tools []string
	// ReplicatedTools are the tools whose claims commit only once the
	// synchronous standbys applied them: a batch holding a key of one of
	// them waits so, whole.
	ReplicatedTools []string
	Max             int
	Lease           time.Duration
	Worker          string
	Now             *time.Time
}

// ClaimKeyParams are the parameters of [Store.ClaimKey].
type ClaimKeyParams struct {
	Key   string
	Lease time.Duration
	// Replicated makes the claim commit only once the synchronous standbys
	// applied it.
	Replicated bool
	Worker     string
	Now        *time.Time
}

// ReclaimExpiredParams are the parameters of [Store.ReclaimExpired].
type ReclaimExpiredParams struct {
	Tools  []string
	Grace  time.Duration
	Max    int
	Lease  time.Duration
	Worker string
	Now    *time.Time
}

// Outcome is the final outcome of one attempt, for [Store.Finish].
type Outcome struct {
	Key string
	// Scope is the key's scope, in its text form. The statement finds the
	// key's row through the unique scope, the one index that tells the
	// planner a match is one row on a table it has no statistics for, and
	// writes it only if it holds Key too.
	Scope   string
	Attempt int
	// State is StateSucceeded, StateFailed or StateNeedsReview.
	State     State
	Response  []byte
	Failure   []byte
	Retention time.Duration
	LastError string
}

// FinishParams are the parameters of [Store.Finish].
type FinishParams struct {
	Outcomes           []Outcome
	TombstoneRetention time.Duration
	// Channel, when not empty, is notified with the finished keys.
	Channel string
	Now     *time.Time
}

// Release is an attempt to put back to pending, for [Store.Release].
type Release struct {
	Key string
	// Scope is the key's scope, as in [Outcome].
	Scope     string
	Attempt   int
	Delay     time.Duration
	Ambiguous bool
	LastError string
}

// ReleaseParams are the parameters of [Store.Release].
type ReleaseParams struct {
	Releases []Release
	// Channel, when not empty, is notified once for the released keys.
	Channel string
	Now     *time.Time
}

// AttemptRef names one attempt of a key.
type AttemptRef struct {
	Key string
	// Scope is the key's scope, as in [Outcome].
	Scope   string
	Attempt int
}

// ClaimBatch claims up to Max due pending keys of Tools in flight under a
// lease, longest due first, skipping keys locked by others.
func (s *Store) ClaimBatch(ctx context.Context, p *ClaimBatchParams) ([]*ClaimedKey, error) {
	var claimed []*ClaimedKey
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		rows, err := q.OutboxClaimBatch(ctx, db, &dbpgx.OutboxClaimBatchParams{
			Now:             p.Now,
			Tools:           p.Tools,
			ReplicatedTools: p.ReplicatedTools,
			MaxRows:         int32(p.Max), //nolint:gosec // bounded by the caller's batch size
			LeaseMs:         p.Lease.Milliseconds(),
			Worker:          p.Worker,
		})
		for _, row := range rows {
			claimed = append(claimed, &ClaimedKey{
				Key:              keyText(row.Key),
				Scope:            hexText(row.Scope),
				Tool:             row.Tool,
				Attempt:          int(row.Attempt),
				Ambiguous:        row.Ambiguous,
				FirstAttemptedAt: row.FirstAttemptedAt,
				LeaseUntil:       row.LeaseUntil,
				NaturalID:        row.NaturalID,
				Args:             row.Args,
				Metadata:         row.Metadata,
				AvailableAt:      row.AvailableAt,
				Now:              row.Now,
			})
		}
		return err
	})
	return claimed, err
}

// ClaimKey claims one pending key in flight under a lease. It returns
// [ErrNoRows] when the key is not pending.
func (s *Store) ClaimKey(ctx context.Context, p *ClaimKeyParams) (*ClaimedKey, error) {
	var claimed *ClaimedKey
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		row, err := q.OutboxClaimKey(ctx, db, &dbpgx.OutboxClaimKeyParams{
			Now:        p.Now,
			LeaseMs:    p.Lease.Milliseconds(),
			Worker:     p.Worker,
			Key:        keyDigest(p.Key),
			Replicated: p.Replicated,
		})
		if err != nil {
			return err
		}
		claimed = &ClaimedKey{
			Key:              p.Key,
			Attempt:          int(row.Attempt),
			Ambiguous:        row.Ambiguous,
			FirstAttemptedAt: row.FirstAttemptedAt,
			LeaseUntil:       row.LeaseUntil,
			Metadata:         row.Metadata,
			Now:              row.Now,
		}
		return nil
	})
	return claimed, err
}

// ReclaimExpired leases up to Max in-flight keys of Tools whose lease ended
// more than Grace ago to Worker under a new attempt.
func (s *Store) ReclaimExpired(ctx context.Context, p *ReclaimExpiredParams) ([]*ClaimedKey, error) {
	var claimed []*ClaimedKey
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		rows, err := q.OutboxReclaimExpired(ctx, db, &dbpgx.OutboxReclaimExpiredParams{
			Now:     p.Now,
			GraceMs: p.Grace.Milliseconds(),
			Tools:   p.Tools,
			MaxRows: int32(p.Max), //nolint:gosec // bounded by the caller's batch size
			LeaseMs: p.Lease.Milliseconds(),
			Worker:  p.Worker,
		})
		for _, row := range rows {
			claimed = append(claimed, &ClaimedKey{
				Key:              keyText(row.Key),
				Scope:            hexText(row.Scope),
				Tool:             row.Tool,
				Attempt:          int(row.Attempt),
				Ambiguous:        true,
				FirstAttemptedAt: row.FirstAttemptedAt,
				NaturalID:        row.NaturalID,
				Args:             row.Args,
				Metadata:         row.Metadata,
				Delivery:         Delivery(deref(row.Delivery)),
				KeyRetention:     time.Duration(deref(row.KeyRetentionMs)) * time.Millisecond,
				Now:              row.Now,
			})
		}
		return err
	})
	return claimed, err
}

// Finish records final outcomes, each fenced by its attempt, in one
// statement, and returns the keys it wrote.
func (s *Store) Finish(ctx context.Context, p *FinishParams) ([]string, error) {
	params := &dbpgx.OutboxFinishParams{
		Now:         p.Now,
		TombstoneMs: p.TombstoneRetention.Milliseconds(),
		Channel:     p.Channel,
	}
	for _, o := range p.Outcomes {
		params.Key = append(params.Key, keyDigest(o.Key))
		params.Scope = append(params.Scope, hexDigest(o.Scope))
		params.Attempt = append(params.Attempt, int32(o.Attempt)) //nolint:gosec // attempts stay small
		params.State = append(params.State, string(o.State))
		params.Response = append(params.Response, o.Response)
		params.Failure = append(params.Failure, o.Failure)
		params.RetentionMs = append(params.RetentionMs, o.Retention.Milliseconds())
		params.LastError = append(params.LastError, o.LastError)
	}
	var keys []string
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		rows, err := q.OutboxFinish(ctx, db, params)
		for _, row := range rows {
			keys = append(keys, keyText(row.Key))
		}
		return err
	})
	return keys, err
}

// Release puts retryable attempts back to pending after their delay, each
// fenced by its attempt, in one statement, and returns the keys it wrote.
func (s *Store) Release(ctx context.Context, p *ReleaseParams) ([]string, error) {
	params := &dbpgx.OutboxReleaseParams{Now: p.Now, Channel: p.Channel}
	for _, r := range p.Releases {
		params.Key = append(params.Key, keyDigest(r.Key))
		params.Scope = append(params.Scope, hexDigest(r.Scope))
		params.Attempt = append(params.Attempt, int32(r.Attempt)) //nolint:gosec // attempts stay small
		params.DelayMs = append(params.DelayMs, r.Delay.Milliseconds())
		params.Ambiguous = append(params.Ambiguous, r.Ambiguous)
		params.LastError = append(params.LastError, r.LastError)
	}
	var keys []string
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		rows, err := q.OutboxRelease(ctx, db, params)
		for _, row := range rows {
			keys = append(keys, keyText(row.Key))
		}
		return err
	})
	return keys, err
}

// RecordedAttempts returns which of the given attempts hold no lease at
// their attempt any more: their outcome was recorded.
func (s *Store) RecordedAttempts(ctx context.Context, attempts []AttemptRef) ([]string, error) {
	params := &dbpgx.OutboxRecordedAttemptsParams{}
	for _, a := range attempts {
		params.Key = append(params.Key, keyDigest(a.Key))
		params.Scope = append(params.Scope, hexDigest(a.Scope))
		params.Attempt = append(params.Attempt, int32(a.Attempt)) //nolint:gosec // attempts stay small
	}
	var keys []string
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		digests, err := q.OutboxRecordedAttempts(ctx, db, params)
		for _, digest := range digests {
			keys = append(keys, keyText(digest))
		}
		return err
	})
	return keys, err
}

// ExtendLease extends the lease of key, while attempt holds it, to lease
// from now (never shortening it). It reports whether attempt still holds the
// key.
func (s *Store) ExtendLease(ctx context.Context, key string, attempt int, lease time.Duration, now *time.Time) (bool, error) {
	var held bool
	err := s.run(ctx, func(q *dbpgx.Queries, db dbpgx.DBTX) error {
		_, err := q.OutboxExtendLease(ctx, db, &dbpgx.OutboxExtendLeaseParams{
			Now:     now,
			LeaseMs: lease.Milliseconds(),
			Key:     keyDigest(key),
			Attempt: int32(attempt), //nolint:gosec // attempts stay small
		})
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		held = err == nil
		return err
	})
	return held, err
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func keyRowFromGet(row *dbpgx.KeyGetRow) *KeyRow {
	if row == nil {
		return nil
	}
	return &KeyRow{
		Key:          keyText(row.Key),
		Scope:        hexText(row.Scope),
		Tenant:       row.Tenant,
		RunID:        row.RunID,
		Step:         row.Step,
		BusinessKey:  row.BusinessKey,
		Tool:         row.Tool,
		NaturalID:    row.NaturalID,
		Fingerprint:  hexText(row.Fingerprint),
		State:        row.State,
		Attempt:      int(row.Attempt),
		Response:     row.Response,
		Failure:      row.Failure,
		CreatedAt:    row.CreatedAt,
		UpdatedAt:    row.UpdatedAt,
		CompletedAt:  row.CompletedAt,
		ExpiresAt:    cmp.Or(row.ExpiresAt, row.ForgetAt),
		LastError:    row.LastError,
		AvailableAt:  row.AvailableAt,
		LeaseUntil:   row.LeaseUntil,
		Metadata:     row.Metadata,
		Delivery:     Delivery(deref(row.Delivery)),
		KeyRetention: time.Duration(deref(row.KeyRetentionMs)) * time.Millisecond,
		Now:          row.Now,
	}
}

func keyInsertParams(k *NewKey) *dbpgx.KeyInsertParams {
	params := &dbpgx.KeyInsertParams{
		Key:         keyDigest(k.Key),
		Scope:       hexDigest(k.Scope),
		Tenant:      k.Tenant,
		RunID:       k.RunID,
		Step:        k.Step,
		BusinessKey: k.BusinessKey,
		Tool:        k.Tool,
		NaturalID:   k.NaturalID,
		Fingerprint: hexDigest(k.Fingerprint),
		Args:        k.Args,
		Metadata:    k.Metadata,
		NotBefore:   k.NotBefore,
		Now:         k.Now,
		Channel:     k.Channel,
		Replicated:  k.ReplicatedClaim && k.Lease > 0,
	}
	if k.Delivery != DeliveryByKey {
		delivery := int16(k.Delivery) //nolint:gosec // one of the Delivery values
		params.Delivery = &delivery
	}
	if k.KeyRetention > 0 {
		// Whole milliseconds, at least one: a positive retention stays
		// positive.
		retention := max(k.KeyRetention.Milliseconds(), 1)
		params.KeyRetentionMs = &retention
	}
	if k.Delay > 0 {
		delay := k.Delay.Milliseconds()
		params.DelayMs = &delay
	}
	if k.Lease > 0 {
		lease, worker := k.Lease.Milliseconds(), k.Worker
		params.LeaseMs, params.Worker = &lease, &worker
	}
	return params
}

func insertedKey(row *dbpgx.KeyInsertRow) *InsertedKey {
	if row == nil {
		return nil
	}
	return &InsertedKey{
		CreatedAt:   row.CreatedAt,
		AvailableAt: row.AvailableAt,
		Attempt:     int(row.Attempt),
		LeaseUntil:  row.LeaseUntil,
		Now:         row.Now,
	}
}
