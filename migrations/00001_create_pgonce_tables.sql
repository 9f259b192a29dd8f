-- +goose Up

-- pgonce_state is a key's state. open covers pending and in flight: a
-- pending key has no lease, an in-flight key holds one. cancelled is final
-- like succeeded and failed: an operator cancelled the key while it was
-- pending. expired is a tombstone.
CREATE TYPE /* TEMPLATE: schema */pgonce_state AS ENUM ('open', 'succeeded', 'failed', 'needs_review', 'expired', 'cancelled');

-- pgonce_key is the key store, the one source of truth for a key's state,
-- and the dispatch queue: one row per intended action, written once by the
-- submit that claims the key. While the key is open the row is its outbox
-- entry. The statement that records the key's outcome takes it off the
-- queue. Retention later turns the row into its own compact tombstone (state
-- expired: key, scope, fingerprint, completion and forget times, nothing
-- else), which still holds the key's index entries, so a late duplicate finds
-- it and nothing runs again; the tombstone is deleted after its horizon.
--
-- Sizes: key, scope and fingerprint are their 32-byte SHA-256 digests (the
-- text forms k1_<hex> and <hex> are the API's, see KEYSPEC.md); optional
-- text is NULL rather than empty; fields that mean nothing in a state are
-- NULL in it. Columns are ordered fixed-width first, widest first, so that
-- no row pays for alignment padding.
--
-- The row invariants are checked by the database for every row written,
-- whoever writes it: one CHECK constraint calls pgonce_key_invariants, below,
-- which raises a check violation naming the invariant a row breaks.
CREATE TABLE /* TEMPLATE: schema */pgonce_key (
    created_at timestamptz NOT NULL DEFAULT now(),
    -- available_at is when a pending key may be claimed (after a backoff, or
    -- at the not-before time it was submitted with). Open keys only.
    available_at timestamptz DEFAULT now(),
    -- lease_until and worker are set while an attempt holds the key.
    lease_until timestamptz,
    -- first_attempted_at starts a provider's key-retention window.
    first_attempted_at timestamptz,
    -- updated_at is when an open or needs-review key last changed; a
    -- finished key last changed when it completed.
    updated_at timestamptz DEFAULT now(),
    completed_at timestamptz,
    -- expires_at is when retention turns a finished key into a tombstone;
    -- forget_at is when the tombstone may be deleted. Both are fixed when
    -- the key finishes.
    expires_at timestamptz,
    forget_at timestamptz,
    step bigint,
    -- key_retention_ms is how long the tool's provider remembers an
    -- idempotency key, fixed at submit so that a reconciler never needs it
    -- repeated; NULL when the provider never forgets.
    key_retention_ms bigint,
    -- attempt fences every write that finishes an attempt: a writer whose
    -- attempt is no longer the row's changes nothing.
    attempt integer NOT NULL DEFAULT 0,
    state /* TEMPLATE: schema */pgonce_state NOT NULL DEFAULT 'open',
    -- delivery is the tool's delivery mode at submit: NULL for
    -- idempotent_by_key (the common mode costs no byte), 1 for
    -- lookup_by_natural_id, 2 for at_most_once.
    delivery smallint,
    -- ambiguous records that the last attempt may or may not have acted.
    ambiguous boolean NOT NULL DEFAULT false,
    key bytea NOT NULL,
    -- scope identifies the logical action (tenant + run + step, or tenant +
    -- business key). It is unique so that one step is one action: asking
    -- step 3 again with another tool or other arguments is a conflict, not
    -- a second action. A key fixes its scope (KEYSPEC.md), so the unique
    -- scope makes the key unique too.
    scope bytea NOT NULL,
    -- fingerprint, a hash of the tool and the canonical arguments, is kept
    -- only for business-key calls: a step call's key already hashes the
    -- tool and the arguments.
    fingerprint bytea,
    tenant text,
    run_id text,
    business_key text,
    tool text,
    natural_id text,
    worker text,
    -- args are the RFC 8785 canonical bytes of the arguments.
    args bytea,
    -- metadata is the call's data outside the key (a JSON object of
    -- strings, such as a trace context), passed to the provider and never
    -- hashed; NULL when the call has none.
    metadata bytea,
    -- response and failure are bytea, not jsonb: jsonb reorders members and
    -- drops whitespace, and a replay must return the provider's exact bytes.
    response bytea,
    failure bytea,
    -- last_error keeps why the last attempt did not succeed.
    last_error text,
    CONSTRAINT pgonce_key_scope_key UNIQUE (scope)
) WITH (
    -- A queue inside a large table: vacuum after 2% of the rows changed,
    -- not the default 20%, so the queue's partial indexes shed dead entries
    -- long before 10^7 finished keys would let them; inserts alone
    -- (submits) trigger a vacuum that sets pages all-visible.
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02
);

-- pgonce_key_invariants returns true for a row (r) that keeps every
-- invariant of pgonce_key and raises a check violation, under the
-- invariant's name (pgonce_key_response_check, ...) and with the key, for
-- one that breaks one. It is the table's one CHECK constraint, and it takes
-- the whole row, because PostgreSQL reads every constraint expression back
-- from its stored text, and compiles it, for each statement that writes to
-- the table, and a submit is a statement of one row: ten constraints of SQL
-- cost it 80-100 µs, and of the 196,000 instructions a function of the 26
-- columns cost it, 84,000 went to reading the 26 column references back.
-- The row as one value costs a submit 108,000 instructions, and a batch
-- statement 6,000 per row more than the columns did, for the copy of the
-- row (callgrind, 1,000 submits and a drain of 2,000 calls).
-- +goose StatementBegin
CREATE FUNCTION /* TEMPLATE: schema */pgonce_key_invariants(r /* TEMPLATE: schema */pgonce_key) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    broken text;
BEGIN
    -- The first invariant the row breaks, or NULL: one expression, as a
    -- CHECK constraint reads it (a condition that is NULL passes).
    broken := CASE
        WHEN NOT (octet_length(r.key) = 32 AND octet_length(r.scope) = 32
            AND (r.fingerprint IS NULL OR octet_length(r.fingerprint) = 32)) THEN 'pgonce_key_digests_check'
        -- A response exactly when succeeded, a failure exactly when failed.
        WHEN (r.state = 'succeeded') <> (r.response IS NOT NULL) THEN 'pgonce_key_response_check'
        WHEN (r.state = 'failed') <> (r.failure IS NOT NULL) THEN 'pgonce_key_failure_check'
        -- A lease and a worker together, only while open, and only for an
        -- attempt that a claim counted.
        WHEN NOT (r.attempt >= 0 AND (r.lease_until IS NULL) = (r.worker IS NULL)
            AND (r.lease_until IS NULL OR (r.state = 'open' AND r.attempt > 0))) THEN 'pgonce_key_lease_check'
        WHEN (r.state = 'open') <> (r.available_at IS NOT NULL) THEN 'pgonce_key_available_check'
        WHEN (r.state IN ('open', 'needs_review')) <> (r.updated_at IS NOT NULL) THEN 'pgonce_key_updated_check'
        -- completed_at exactly when finished; the retention times exactly
        -- while they apply.
        WHEN (r.state IN ('succeeded', 'failed', 'cancelled', 'expired')) <> (r.completed_at IS NOT NULL) THEN 'pgonce_key_completed_check'
        WHEN (r.state IN ('succeeded', 'failed', 'cancelled')) <> (r.expires_at IS NOT NULL)
            OR (r.state IN ('succeeded', 'failed', 'cancelled', 'expired')) <> (r.forget_at IS NOT NULL) THEN 'pgonce_key_retention_check'
        -- The tool's settings at submit, and bounded metadata.
        WHEN NOT ((r.delivery IS NULL OR r.delivery IN (1, 2))
            AND (r.key_retention_ms IS NULL OR r.key_retention_ms > 0)
            AND (r.metadata IS NULL OR octet_length(r.metadata) BETWEEN 2 AND 8192)) THEN 'pgonce_key_tool_settings_check'
        -- A tombstone keeps only what a late duplicate needs; every other
        -- key keeps its call.
        WHEN NOT CASE
            WHEN r.state = 'expired' THEN
                r.tool IS NULL AND r.args IS NULL AND r.step IS NULL AND r.run_id IS NULL AND r.tenant IS NULL
                AND r.business_key IS NULL AND r.natural_id IS NULL AND r.last_error IS NULL AND r.first_attempted_at IS NULL
                AND r.metadata IS NULL AND r.delivery IS NULL AND r.key_retention_ms IS NULL
            ELSE r.tool IS NOT NULL AND r.args IS NOT NULL AND r.step IS NOT NULL
        END THEN 'pgonce_key_call_check'
    END;
    IF broken IS NULL THEN
        RETURN true;
    END IF;
    RAISE EXCEPTION 'pgonce_key row % (state %) breaks %: %', encode(r.key, 'hex'), r.state, broken, CASE broken
            WHEN 'pgonce_key_digests_check' THEN 'key, scope and fingerprint are 32-byte digests'
            WHEN 'pgonce_key_response_check' THEN 'a response exactly when succeeded'
            WHEN 'pgonce_key_failure_check' THEN 'a failure exactly when failed'
            WHEN 'pgonce_key_lease_check' THEN 'a lease and a worker together, only while open, for a counted attempt'
            WHEN 'pgonce_key_available_check' THEN 'available_at exactly when open'
            WHEN 'pgonce_key_updated_check' THEN 'updated_at exactly when open or needs review'
            WHEN 'pgonce_key_completed_check' THEN 'completed_at exactly when finished'
            WHEN 'pgonce_key_retention_check' THEN 'expires_at while retained, forget_at once finished'
            WHEN 'pgonce_key_tool_settings_check' THEN 'a known delivery, a positive key retention, metadata of 2 to 8192 bytes'
            ELSE 'a tombstone keeps no call, every other key keeps its tool, arguments and step'
        END
        USING ERRCODE = 'check_violation', CONSTRAINT = broken, TABLE = 'pgonce_key';
END
$$;
-- +goose StatementEnd

ALTER TABLE /* TEMPLATE: schema */pgonce_key
    ADD CONSTRAINT pgonce_key_invariants_check CHECK (/* TEMPLATE: schema */pgonce_key_invariants(pgonce_key));

-- Looking a key up needs equality only; a hash index stores a 4-byte hash
-- per key instead of the 32-byte key. Uniqueness is the scope's.
CREATE INDEX pgonce_key_key_idx ON /* TEMPLATE: schema */pgonce_key USING hash (key);
-- Claiming reads the head of this index for each tool it serves, whatever
-- the number of finished keys, and whatever waits for tools it does not
-- serve.
CREATE INDEX pgonce_key_due_idx ON /* TEMPLATE: schema */pgonce_key (tool, available_at) WHERE state = 'open' AND lease_until IS NULL;
-- The reconciler reads expired leases from this one.
CREATE INDEX pgonce_key_lease_idx ON /* TEMPLATE: schema */pgonce_key (lease_until) WHERE lease_until IS NOT NULL;
-- Retention reads finished keys past their retention, and tombstones past
-- their horizon, here.
CREATE INDEX pgonce_key_expires_at_idx ON /* TEMPLATE: schema */pgonce_key (expires_at) WHERE state IN ('succeeded', 'failed', 'cancelled');
CREATE INDEX pgonce_key_forget_at_idx ON /* TEMPLATE: schema */pgonce_key (forget_at) WHERE state = 'expired';
-- Listing (Client.List) pages through one state at a time in creation
-- order. Succeeded keys and tombstones, which make up nearly all of a large
-- table, are left out, so that they pay no byte for it: the list covers the
-- keys an operator acts on (pending, in flight, failed, needs review,
-- cancelled), and a succeeded key is read by its key.
CREATE INDEX pgonce_key_list_idx ON /* TEMPLATE: schema */pgonce_key (state, created_at, key) WHERE state NOT IN ('succeeded', 'expired');

-- +goose Down
ALTER TABLE /* TEMPLATE: schema */pgonce_key DROP CONSTRAINT pgonce_key_invariants_check;
DROP FUNCTION /* TEMPLATE: schema */pgonce_key_invariants;
DROP TABLE /* TEMPLATE: schema */pgonce_key;
DROP TYPE /* TEMPLATE: schema */pgonce_state;
