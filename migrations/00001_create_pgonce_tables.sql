-- +goose Up

-- pgonce_key is the key store, the one source of truth for a key's state,
-- and the dispatch queue: one row per intended action, written once by the
-- submit that claims the key. While the key is open the row is its outbox
-- entry: pending without a lease, in flight with one. The statement that
-- records the key's outcome takes it off the queue. Retention later turns
-- the row into its own tombstone (state expired: the response and arguments
-- dropped, the key, scope and completion time kept), which still holds the
-- key's unique index entries, so a late duplicate finds it and nothing runs
-- again; the tombstone is deleted after its own horizon. One row per call,
-- not a key row and a queue row, halves the rows a submit writes.
CREATE TABLE /* TEMPLATE: schema */pgonce_key (
    key text PRIMARY KEY,
    -- scope identifies the logical action (tenant + run + step, or tenant +
    -- business key). It is unique so that one step is one action: asking step
    -- 3 again with another tool or other arguments is a conflict, not a second
    -- action.
    scope text NOT NULL,
    tenant text NOT NULL,
    run_id text NOT NULL,
    step bigint NOT NULL,
    business_key text NOT NULL,
    tool text NOT NULL,
    natural_id text NOT NULL,
    -- fingerprint is a hash of the tool and the canonical arguments.
    fingerprint text NOT NULL,
    -- args are the RFC 8785 canonical bytes of the arguments.
    args bytea NOT NULL,
    -- open: pending, or in flight while lease_until is set. expired: a
    -- tombstone.
    state text NOT NULL DEFAULT 'open',
    -- attempt fences every write that finishes an attempt: a writer whose
    -- attempt is no longer the row's changes nothing.
    attempt integer NOT NULL DEFAULT 0,
    -- available_at is when a pending key may be claimed (after a backoff).
    available_at timestamptz NOT NULL DEFAULT now(),
    -- lease_until and worker are set while an attempt holds the key.
    lease_until timestamptz,
    worker text,
    -- first_attempted_at starts a provider's key-retention window.
    first_attempted_at timestamptz,
    -- ambiguous records that the last attempt may or may not have acted.
    ambiguous boolean NOT NULL DEFAULT false,
    -- response and failure are bytea, not jsonb: jsonb reorders members and
    -- drops whitespace, and a replay must return the provider's exact bytes.
    response bytea,
    failure bytea,
    -- last_error keeps why the last attempt did not succeed.
    last_error text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    completed_at timestamptz,
    -- expires_at is when retention may turn a finished key into a tombstone,
    -- and, for a tombstone, when it may be deleted. Open and needs-review keys
    -- have none.
    expires_at timestamptz,
    -- forget_at is when the tombstone of a finished key may be deleted, fixed
    -- when the key finishes.
    forget_at timestamptz,
    CONSTRAINT pgonce_key_scope_key UNIQUE (scope)
    -- The row's invariants (state is one of open, succeeded, failed,
    -- needs_review, expired; a response exactly when succeeded, a failure
    -- exactly when failed; completed_at exactly when succeeded, failed or
    -- expired; a lease and a worker together, and only while open) are kept
    -- by the statements in queries/, the only writers, and checked on every
    -- test's schema before it is dropped. They are not CHECK constraints on
    -- purpose: PostgreSQL prepares every CHECK expression again for each
    -- statement, and for the single-row insert that a submit is, five of
    -- them cost 25-30 microseconds, an eighth of the statement.
);

-- Claiming reads the head of this index for each tool it serves, whatever
-- the number of finished keys, and whatever waits for tools it does not
-- serve.
CREATE INDEX pgonce_key_due_idx ON /* TEMPLATE: schema */pgonce_key (tool, available_at) WHERE state = 'open' AND lease_until IS NULL;
-- The reconciler reads expired leases from this one.
CREATE INDEX pgonce_key_lease_idx ON /* TEMPLATE: schema */pgonce_key (lease_until) WHERE lease_until IS NOT NULL;
-- Retention reads finished keys and tombstones past their horizon here.
CREATE INDEX pgonce_key_expires_at_idx ON /* TEMPLATE: schema */pgonce_key (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX pgonce_key_needs_review_idx ON /* TEMPLATE: schema */pgonce_key (updated_at) WHERE state = 'needs_review';

-- +goose Down
DROP TABLE /* TEMPLATE: schema */pgonce_key;
