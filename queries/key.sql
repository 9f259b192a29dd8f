-- name: KeyExpire :one
-- KeyExpire turns up to max_rows finished keys past their retention into
-- compact tombstones, in place: only what a late duplicate needs stays (key,
-- scope, fingerprint, completion and forget times, and the state the key
-- finished in), and so do the index entries on key and scope, so that a
-- concurrent or late duplicate conflicts with the tombstone and never runs.
-- The key's operator decisions and attempts go with its call. The tombstone lasts until the forget_at fixed when the key
-- finished. Only succeeded, failed and cancelled keys have an expiry;
-- pending, in-flight and needs-review keys are never touched. SKIP LOCKED lets
-- pruning run beside anything else without waiting, and small batches keep
-- locks short.
WITH due AS (
    SELECT pgonce_key.scope
    FROM /* TEMPLATE: schema */pgonce_key
    WHERE pgonce_key.expires_at < coalesce(sqlc.narg('now')::timestamptz, now())
        AND pgonce_key.state IN ('succeeded', 'failed', 'cancelled')
    ORDER BY pgonce_key.expires_at
    LIMIT @max_rows::integer
    FOR UPDATE SKIP LOCKED
),
expired AS (
    UPDATE /* TEMPLATE: schema */pgonce_key
    SET
        state = 'expired',
        expired_state = pgonce_key.state,
        tenant = NULL,
        run_id = NULL,
        step = NULL,
        business_key = NULL,
        tool = NULL,
        natural_id = NULL,
        args = NULL,
        metadata = NULL,
        delivery = NULL,
        key_retention_ms = NULL,
        response = NULL,
        failure = NULL,
        last_error = NULL,
        first_attempted_at = NULL,
        expires_at = NULL,
        forget_at = greatest(pgonce_key.forget_at, coalesce(sqlc.narg('now')::timestamptz, now()))
    FROM due
    -- Rows are matched on the unique scope, as in OutboxFinish.
    WHERE pgonce_key.scope = due.scope
    RETURNING pgonce_key.key
),
decisions AS (
    DELETE FROM /* TEMPLATE: schema */pgonce_resolution
    USING expired
    WHERE pgonce_resolution.key = expired.key
),
attempts AS (
    DELETE FROM /* TEMPLATE: schema */pgonce_attempt
    USING expired
    WHERE pgonce_attempt.key = expired.key
)
SELECT count(*)::bigint AS expired
FROM expired;

-- name: KeyForget :one
-- KeyForget deletes up to max_rows tombstones past their horizon; only then
-- can the same action run again.
WITH due AS (
    SELECT pgonce_key.scope
    FROM /* TEMPLATE: schema */pgonce_key
    WHERE pgonce_key.forget_at < coalesce(sqlc.narg('now')::timestamptz, now())
        AND pgonce_key.state = 'expired'
    ORDER BY pgonce_key.forget_at
    LIMIT @max_rows::integer
    FOR UPDATE SKIP LOCKED
),
deleted AS (
    DELETE FROM /* TEMPLATE: schema */pgonce_key
    USING due
    -- Rows are matched on the unique scope, as in OutboxFinish.
    WHERE pgonce_key.scope = due.scope
    RETURNING pgonce_key.key
)
SELECT count(*)::bigint AS forgotten
FROM deleted;

-- name: KeyCountExpirable :one
SELECT count(*)::bigint AS expirable
FROM /* TEMPLATE: schema */pgonce_key
WHERE pgonce_key.expires_at < coalesce(sqlc.narg('now')::timestamptz, now())
    AND pgonce_key.state IN ('succeeded', 'failed', 'cancelled');

-- name: KeyCountForgettable :one
SELECT count(*)::bigint AS forgettable
FROM /* TEMPLATE: schema */pgonce_key
WHERE pgonce_key.forget_at < coalesce(sqlc.narg('now')::timestamptz, now())
    AND pgonce_key.state = 'expired';

-- name: KeyCountByToolAndState :many
-- KeyCountByToolAndState counts keys per tool and state, for operators. It
-- reads the whole key table.
-- A tombstone keeps no tool: tombstones count under the empty tool.
SELECT
    coalesce(pgonce_key.tool, '')::text AS tool,
    (CASE
        WHEN pgonce_key.state = 'open' AND pgonce_key.lease_until IS NOT NULL THEN 'in_flight'
        WHEN pgonce_key.state = 'open' THEN 'pending'
        ELSE pgonce_key.state::text
    END)::text AS state,
    count(*)::bigint AS keys
FROM /* TEMPLATE: schema */pgonce_key
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: KeyList :many
-- KeyList pages through keys in creation order, (created_at, key), one
-- state at a time on pgonce_key_list_idx: each wanted state reads its own
-- range of the index from the cursor on, and the first max_rows of all of
-- them are returned. states is a comma-separated list of stored states
-- (not an array: the database/sql output of this file would need lib/pq
-- for one); succeeded and expired are not in the index and never listed.
-- The cursor and the time range are index conditions; tool, tenant and
-- run id filter the rows read.
SELECT
    listed.key,
    listed.state,
    listed.tenant,
    listed.run_id,
    listed.step,
    listed.business_key,
    listed.tool,
    listed.attempt,
    listed.created_at,
    listed.updated_at,
    listed.completed_at,
    listed.available_at,
    listed.lease_until,
    listed.last_error,
    listed.args_head,
    listed.args_size,
    coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
FROM unnest(string_to_array(@states::text, ',')) AS wanted (state)
CROSS JOIN LATERAL (
    SELECT
        pgonce_key.key,
        pgonce_key.state::text AS state,
        coalesce(pgonce_key.tenant, '')::text AS tenant,
        coalesce(pgonce_key.run_id, '')::text AS run_id,
        coalesce(pgonce_key.step, 0)::bigint AS step,
        coalesce(pgonce_key.business_key, '')::text AS business_key,
        coalesce(pgonce_key.tool, '')::text AS tool,
        pgonce_key.attempt,
        pgonce_key.created_at,
        coalesce(pgonce_key.updated_at, pgonce_key.completed_at, pgonce_key.created_at)::timestamptz AS updated_at,
        pgonce_key.completed_at,
        coalesce(pgonce_key.available_at, pgonce_key.created_at)::timestamptz AS available_at,
        pgonce_key.lease_until,
        pgonce_key.last_error,
        -- The arguments' first bytes, for a list that shows what each call
        -- asked.
        substring(pgonce_key.args FROM 1 FOR @args_bytes::integer)::bytea AS args_head,
        coalesce(octet_length(pgonce_key.args), 0)::integer AS args_size
    FROM /* TEMPLATE: schema */pgonce_key
    WHERE pgonce_key.state = wanted.state::/* TEMPLATE: schema */pgonce_state
        -- The index's predicate, spelled as it is so that the planner can
        -- use the partial index.
        AND pgonce_key.state NOT IN ('succeeded', 'expired')
        AND (pgonce_key.created_at, pgonce_key.key) > (@after_created_at::timestamptz, @after_key::bytea)
        AND pgonce_key.created_at < coalesce(sqlc.narg('created_before')::timestamptz, 'infinity'::timestamptz)
        AND (
            wanted.state <> 'open'
            OR (@pending::boolean AND pgonce_key.lease_until IS NULL)
            OR (@in_flight::boolean AND pgonce_key.lease_until IS NOT NULL)
        )
        AND (sqlc.narg('tool')::text IS NULL OR pgonce_key.tool = sqlc.narg('tool')::text)
        AND (sqlc.narg('tenant')::text IS NULL OR pgonce_key.tenant = sqlc.narg('tenant')::text)
        AND (sqlc.narg('run_id')::text IS NULL OR pgonce_key.run_id = sqlc.narg('run_id')::text)
    ORDER BY
        pgonce_key.created_at,
        pgonce_key.key
    LIMIT @max_rows::integer
) AS listed
ORDER BY
    listed.created_at,
    listed.key
LIMIT @max_rows::integer;

-- name: KeyListByScope :many
-- KeyListByScope pages through the keys that are not tombstones in scope
-- order, from after_scope on, on the scope's unique index: a walk of the
-- whole table, which comparing the keys of two primaries after a failover
-- makes once. changed_since, when not NULL, keeps only the keys created or
-- changed at or after it; it filters the rows read.
SELECT
    pgonce_key.key,
    pgonce_key.scope,
    pgonce_key.state::text AS state,
    coalesce(pgonce_key.tenant, '')::text AS tenant,
    coalesce(pgonce_key.run_id, '')::text AS run_id,
    coalesce(pgonce_key.step, 0)::bigint AS step,
    coalesce(pgonce_key.business_key, '')::text AS business_key,
    coalesce(pgonce_key.tool, '')::text AS tool,
    pgonce_key.attempt,
    pgonce_key.created_at,
    coalesce(pgonce_key.updated_at, pgonce_key.completed_at, pgonce_key.created_at)::timestamptz AS updated_at,
    pgonce_key.completed_at,
    coalesce(pgonce_key.available_at, pgonce_key.created_at)::timestamptz AS available_at,
    pgonce_key.lease_until,
    pgonce_key.last_error,
    coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
FROM /* TEMPLATE: schema */pgonce_key
WHERE pgonce_key.scope > @after_scope::bytea
    AND pgonce_key.state <> 'expired'
    AND (sqlc.narg('changed_since')::timestamptz IS NULL
        OR coalesce(pgonce_key.updated_at, pgonce_key.completed_at, pgonce_key.created_at) >= sqlc.narg('changed_since')::timestamptz)
ORDER BY pgonce_key.scope
LIMIT @max_rows::integer;

-- name: KeyListByKeys :many
-- KeyListByKeys reads the keys given, each on the key's hash index, with
-- KeyListByScope's columns; a key the table lacks has no row. Tombstones
-- are read too.
SELECT
    pgonce_key.key,
    pgonce_key.scope,
    pgonce_key.state::text AS state,
    coalesce(pgonce_key.tenant, '')::text AS tenant,
    coalesce(pgonce_key.run_id, '')::text AS run_id,
    coalesce(pgonce_key.step, 0)::bigint AS step,
    coalesce(pgonce_key.business_key, '')::text AS business_key,
    coalesce(pgonce_key.tool, '')::text AS tool,
    pgonce_key.attempt,
    pgonce_key.created_at,
    coalesce(pgonce_key.updated_at, pgonce_key.completed_at, pgonce_key.created_at)::timestamptz AS updated_at,
    pgonce_key.completed_at,
    coalesce(pgonce_key.available_at, pgonce_key.created_at)::timestamptz AS available_at,
    pgonce_key.lease_until,
    pgonce_key.last_error,
    coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
FROM unnest(@keys::bytea[]) AS wanted (key)
JOIN /* TEMPLATE: schema */pgonce_key ON pgonce_key.key = wanted.key;

-- name: KeyReadBack :one
-- KeyReadBack reads where a key stands after a transaction that recorded
-- its outcome (KeyFinishInTx) lost its connection during COMMIT. FOR SHARE
-- waits for a transaction still holding the key's row (a COMMIT the server
-- is still running, or one it has not yet rolled back) and then reads the
-- row's latest version: the key finished at the attempt if that COMMIT
-- took, and is still open at the attempt if it did not.
SELECT
    pgonce_key.state::text AS state,
    pgonce_key.attempt,
    (pgonce_key.lease_until IS NOT NULL)::boolean AS leased
FROM /* TEMPLATE: schema */pgonce_key
WHERE pgonce_key.key = @key::bytea
FOR SHARE;
