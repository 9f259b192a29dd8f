-- +goose Up

-- A transactional tool (delivery 3) records its outcome in the transaction
-- that holds its effect: its keys store the new delivery, which the key
-- table's invariants now accept. The function is pgonce_key_invariants of
-- 00004 with that one value added; existing rows are not re-checked.
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
        WHEN NOT ((r.delivery IS NULL OR r.delivery IN (1, 2, 3))
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

-- +goose Down
-- A key stored with delivery 3 no longer passes the invariants once this
-- is undone: it is rewritten as a by-key key (NULL), which settles an
-- uncertain attempt by trying again, as a transactional key does.
UPDATE /* TEMPLATE: schema */pgonce_key SET delivery = NULL WHERE delivery = 3;
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
