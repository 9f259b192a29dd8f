-- +goose Up

-- pgonce_key is the key store and the one source of truth for a key's state.
-- A key row is written once per intended action. Retention later turns it into
-- its own tombstone (state expired: the response and arguments dropped, the
-- key, scope and completion time kept), which still holds the key's unique
-- index entries, so a late duplicate finds it and nothing runs again; the
-- tombstone is deleted after its own horizon.
CREATE TABLE pgonce_key (
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
    -- open: pending or in flight, as the key's outbox row says. expired: a
    -- tombstone.
    state text NOT NULL DEFAULT 'open',
    attempt integer NOT NULL DEFAULT 0,
    -- response and failure are bytea, not jsonb: jsonb reorders members and
    -- drops whitespace, and a replay must return the provider's exact bytes.
    response bytea,
    failure bytea,
    -- last_error keeps why the last attempt did not succeed, for a failed or
    -- needs-review key whose outbox row is gone.
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
    CONSTRAINT pgonce_key_scope_key UNIQUE (scope),
    CONSTRAINT pgonce_key_state_check CHECK (state IN ('open', 'succeeded', 'failed', 'needs_review', 'expired')),
    CONSTRAINT pgonce_key_response_check CHECK ((state = 'succeeded') = (response IS NOT NULL)),
    CONSTRAINT pgonce_key_failure_check CHECK ((state = 'failed') = (failure IS NOT NULL)),
    CONSTRAINT pgonce_key_completed_check CHECK ((state IN ('succeeded', 'failed', 'expired')) = (completed_at IS NOT NULL))
);

CREATE INDEX pgonce_key_expires_at_idx ON pgonce_key (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX pgonce_key_needs_review_idx ON pgonce_key (updated_at) WHERE state = 'needs_review';

-- pgonce_outbox is the dispatch queue: one row per open key. A row with no
-- lease is pending; a row with a lease is in flight. The row is written in
-- the statement that writes its key (or sends a reviewed key back), and
-- deleted in the statement that records the key's outcome; only finished
-- keys are ever deleted. There is no foreign key to pgonce_key on purpose:
-- its check was a third of the submit statement's execution time and
-- guarded nothing those statements do not.
CREATE TABLE pgonce_outbox (
    key text PRIMARY KEY,
    tool text NOT NULL,
    available_at timestamptz NOT NULL DEFAULT now(),
    -- attempt fences every write that finishes an attempt: a writer whose
    -- attempt is no longer the row's changes nothing.
    attempt integer NOT NULL DEFAULT 0,
    lease_until timestamptz,
    worker text,
    -- first_attempted_at starts a provider's key-retention window.
    first_attempted_at timestamptz,
    -- ambiguous records that the last attempt may or may not have acted.
    ambiguous boolean NOT NULL DEFAULT false,
    last_error text,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT pgonce_outbox_lease_check CHECK ((lease_until IS NULL) = (worker IS NULL))
);

-- Claiming reads the head of this index, whatever the table's size.
CREATE INDEX pgonce_outbox_due_idx ON pgonce_outbox (available_at) WHERE lease_until IS NULL;
-- The reconciler reads expired leases from this one.
CREATE INDEX pgonce_outbox_lease_idx ON pgonce_outbox (lease_until) WHERE lease_until IS NOT NULL;

-- +goose Down
DROP TABLE pgonce_outbox;
DROP TABLE pgonce_key;
