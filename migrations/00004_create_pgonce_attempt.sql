-- +goose Up

-- pgonce_attempt keeps the attempts of a key that did not finish it the
-- first time: every attempt that ended in a retry, went to review or failed,
-- whose lease ran out under it (the reconciler took the key over), and the
-- attempt that finally succeeded after those. A key that succeeds at its
-- first attempt, nearly every key, writes no row here: its one attempt is
-- the key row's own (first_attempted_at, completed_at). Each row is written
-- by the statement that ends its attempt, fenced like it, so an attempt that
-- no longer holds its key writes none. Retention deletes a key's attempts in
-- the statement that turns the key into a tombstone. key is not a foreign
-- key, as in pgonce_resolution.
CREATE TABLE /* TEMPLATE: schema */pgonce_attempt (
    -- started_at is when the attempt claimed its key, by the database's
    -- clock; ended_at when it ended (for a lease that ran out: when the
    -- reconciler took the key over).
    started_at timestamptz NOT NULL,
    ended_at timestamptz NOT NULL,
    attempt integer NOT NULL,
    key bytea NOT NULL,
    -- outcome is how the attempt ended: succeeded, failed or needs_review
    -- (the key's outcome), retry (tried again after a backoff), uncertain
    -- (tried again, but the provider may have acted) or lease_expired.
    outcome text NOT NULL,
    worker text,
    error text,
    -- The attempt number is unique per key, since every claim moves it on;
    -- the statements that write here skip a row that exists rather than fail
    -- the outcome they record.
    CONSTRAINT pgonce_attempt_pkey PRIMARY KEY (key, attempt),
    CONSTRAINT pgonce_attempt_key_check CHECK (octet_length(key) = 32),
    CONSTRAINT pgonce_attempt_outcome_check CHECK (outcome IN ('succeeded', 'failed', 'needs_review', 'retry', 'uncertain', 'lease_expired'))
);

-- expired_state keeps, in a tombstone, the state its key finished in
-- (succeeded, failed or cancelled), so that an operator reading a late
-- duplicate's tombstone knows what had happened. NULL for every other key:
-- as the table's 29th column it costs those rows no byte (the row's null
-- bitmap has room), and a tombstone none either, for the four bytes fill
-- what its row's alignment left.
ALTER TABLE /* TEMPLATE: schema */pgonce_key ADD COLUMN expired_state /* TEMPLATE: schema */pgonce_state;

-- The invariants of 00001, with the tombstone's expired_state.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */pgonce_key_invariants(r /* TEMPLATE: schema */pgonce_key) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    broken text;
BEGIN
    broken := CASE
        WHEN NOT (octet_length(r.key) = 32 AND octet_length(r.scope) = 32
            AND (r.fingerprint IS NULL OR octet_length(r.fingerprint) = 32)) THEN 'pgonce_key_digests_check'
        WHEN (r.state = 'succeeded') <> (r.response IS NOT NULL) THEN 'pgonce_key_response_check'
        WHEN (r.state = 'failed') <> (r.failure IS NOT NULL) THEN 'pgonce_key_failure_check'
        WHEN NOT (r.attempt >= 0 AND (r.lease_until IS NULL) = (r.worker IS NULL)
            AND (r.lease_until IS NULL OR (r.state = 'open' AND r.attempt > 0))) THEN 'pgonce_key_lease_check'
        WHEN (r.state = 'open') <> (r.available_at IS NOT NULL) THEN 'pgonce_key_available_check'
        WHEN (r.state IN ('open', 'needs_review')) <> (r.updated_at IS NOT NULL) THEN 'pgonce_key_updated_check'
        WHEN (r.state IN ('succeeded', 'failed', 'cancelled', 'expired')) <> (r.completed_at IS NOT NULL) THEN 'pgonce_key_completed_check'
        WHEN (r.state IN ('succeeded', 'failed', 'cancelled')) <> (r.expires_at IS NOT NULL)
            OR (r.state IN ('succeeded', 'failed', 'cancelled', 'expired')) <> (r.forget_at IS NOT NULL) THEN 'pgonce_key_retention_check'
        WHEN NOT ((r.delivery IS NULL OR r.delivery IN (1, 2))
            AND (r.key_retention_ms IS NULL OR r.key_retention_ms > 0)
            AND (r.metadata IS NULL OR octet_length(r.metadata) BETWEEN 2 AND 8192)) THEN 'pgonce_key_tool_settings_check'
        WHEN NOT CASE
            WHEN r.state = 'expired' THEN
                r.tool IS NULL AND r.args IS NULL AND r.step IS NULL AND r.run_id IS NULL AND r.tenant IS NULL
                AND r.business_key IS NULL AND r.natural_id IS NULL AND r.last_error IS NULL AND r.first_attempted_at IS NULL
                AND r.metadata IS NULL AND r.delivery IS NULL AND r.key_retention_ms IS NULL
            ELSE r.tool IS NOT NULL AND r.args IS NOT NULL AND r.step IS NOT NULL
        END THEN 'pgonce_key_call_check'
        -- A tombstone keeps the final state its key had; no other key has
        -- one.
        WHEN CASE
            WHEN r.state = 'expired' THEN r.expired_state IS NULL OR r.expired_state NOT IN ('succeeded', 'failed', 'cancelled')
            ELSE r.expired_state IS NOT NULL
        END THEN 'pgonce_key_expired_state_check'
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
            WHEN 'pgonce_key_expired_state_check' THEN 'a tombstone keeps the state it finished in (succeeded, failed or cancelled), no other key has one'
            ELSE 'a tombstone keeps no call, every other key keeps its tool, arguments and step'
        END
        USING ERRCODE = 'check_violation', CONSTRAINT = broken, TABLE = 'pgonce_key';
END
$$;
-- +goose StatementEnd

-- Search (Client.Search) and the counts of recent keys (Client.Recent) read
-- the keys created in a time window through this BRIN index: a summary of
-- created_at per 128 pages of the table (1 MB), some 30 bytes per thousand
-- keys, which a submit updates only when its key lands in a range already
-- summarized whose bounds it extends. Keys are created in time order and
-- mostly appended, so a window of recent keys reads the table's last
-- ranges, however large the table; a range that retention freed space in
-- and new keys then filled is read whole by every window it overlaps.
CREATE INDEX pgonce_key_created_at_idx ON /* TEMPLATE: schema */pgonce_key USING brin (created_at);

-- Search finds a key by its natural id here, of the keys that have one
-- (the calls of tools whose providers are looked up by natural id, most
-- often), so that other keys pay no byte. A B-tree, not a hash index like
-- the key's: a hash index rebuilt (REINDEX, VACUUM FULL) allocates buckets
-- for every row of the table, whatever its predicate leaves out.
CREATE INDEX pgonce_key_natural_id_idx ON /* TEMPLATE: schema */pgonce_key (natural_id) WHERE natural_id IS NOT NULL;

-- +goose Down
DROP INDEX /* TEMPLATE: schema */pgonce_key_natural_id_idx;
DROP INDEX /* TEMPLATE: schema */pgonce_key_created_at_idx;
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION /* TEMPLATE: schema */pgonce_key_invariants(r /* TEMPLATE: schema */pgonce_key) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    broken text;
BEGIN
    broken := CASE
        WHEN NOT (octet_length(r.key) = 32 AND octet_length(r.scope) = 32
            AND (r.fingerprint IS NULL OR octet_length(r.fingerprint) = 32)) THEN 'pgonce_key_digests_check'
        WHEN (r.state = 'succeeded') <> (r.response IS NOT NULL) THEN 'pgonce_key_response_check'
        WHEN (r.state = 'failed') <> (r.failure IS NOT NULL) THEN 'pgonce_key_failure_check'
        WHEN NOT (r.attempt >= 0 AND (r.lease_until IS NULL) = (r.worker IS NULL)
            AND (r.lease_until IS NULL OR (r.state = 'open' AND r.attempt > 0))) THEN 'pgonce_key_lease_check'
        WHEN (r.state = 'open') <> (r.available_at IS NOT NULL) THEN 'pgonce_key_available_check'
        WHEN (r.state IN ('open', 'needs_review')) <> (r.updated_at IS NOT NULL) THEN 'pgonce_key_updated_check'
        WHEN (r.state IN ('succeeded', 'failed', 'cancelled', 'expired')) <> (r.completed_at IS NOT NULL) THEN 'pgonce_key_completed_check'
        WHEN (r.state IN ('succeeded', 'failed', 'cancelled')) <> (r.expires_at IS NOT NULL)
            OR (r.state IN ('succeeded', 'failed', 'cancelled', 'expired')) <> (r.forget_at IS NOT NULL) THEN 'pgonce_key_retention_check'
        WHEN NOT ((r.delivery IS NULL OR r.delivery IN (1, 2))
            AND (r.key_retention_ms IS NULL OR r.key_retention_ms > 0)
            AND (r.metadata IS NULL OR octet_length(r.metadata) BETWEEN 2 AND 8192)) THEN 'pgonce_key_tool_settings_check'
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
ALTER TABLE /* TEMPLATE: schema */pgonce_key DROP COLUMN expired_state;
DROP TABLE /* TEMPLATE: schema */pgonce_attempt;
