-- The statements on pgonce_key that run inside a caller's transaction, for
-- both drivers: sqlc's database/sql output (internal/dbstd) is generated from
-- this file alone, the pgx output from every file. The rest of pgonce_key's
-- statements are in key.sql.

-- name: KeyInsert :one
-- KeyInsert writes the key claim, which is also its outbox entry, and
-- notifies dispatchers when the key is pending: one row, one statement, no
-- CTE. ON CONFLICT DO NOTHING has no target, so it covers both the key and
-- the scope, and a tombstone (an expired key keeps its row) conflicts like
-- any other key; RETURNING, and so the notification, runs only for an
-- inserted row. A caller that gets no row reads the existing one with
-- KeyGetByKeyOrScope in a new statement: under READ COMMITTED only a new
-- statement's snapshot sees a row that another transaction committed while
-- this insert waited on the unique index. With a lease the key is claimed in
-- flight at once (the inline Do path); with replicated set as well, the
-- insert's commit waits until the synchronous standbys applied it, as a
-- claim of OutboxClaimBatch does. A pending key is due at the latest of
-- now, not_before and now + delay_ms (greatest ignores NULLs).
INSERT INTO /* TEMPLATE: schema */pgonce_key (
    key,
    scope,
    tenant,
    run_id,
    step,
    business_key,
    tool,
    natural_id,
    fingerprint,
    args,
    metadata,
    delivery,
    key_retention_ms,
    attempt,
    available_at,
    lease_until,
    worker,
    first_attempted_at,
    created_at,
    updated_at
) VALUES (
    @key::bytea,
    @scope::bytea,
    nullif(@tenant::text, ''),
    nullif(@run_id::text, ''),
    @step::bigint,
    nullif(@business_key::text, ''),
    @tool::text,
    nullif(@natural_id::text, ''),
    sqlc.narg('fingerprint')::bytea,
    @args::bytea,
    sqlc.narg('metadata')::bytea,
    sqlc.narg('delivery')::smallint,
    sqlc.narg('key_retention_ms')::bigint,
    CASE WHEN sqlc.narg('lease_ms')::bigint IS NULL THEN 0 ELSE 1 END,
    greatest(
        coalesce(sqlc.narg('now')::timestamptz, now()),
        sqlc.narg('not_before')::timestamptz,
        coalesce(sqlc.narg('now')::timestamptz, now()) + sqlc.narg('delay_ms')::bigint * interval '1 millisecond'
    ),
    coalesce(sqlc.narg('now')::timestamptz, now()) + sqlc.narg('lease_ms')::bigint * interval '1 millisecond',
    sqlc.narg('worker')::text,
    CASE WHEN sqlc.narg('lease_ms')::bigint IS NOT NULL THEN coalesce(sqlc.narg('now')::timestamptz, now()) END,
    coalesce(sqlc.narg('now')::timestamptz, now()),
    coalesce(sqlc.narg('now')::timestamptz, now())
)
ON CONFLICT DO NOTHING
RETURNING
    pgonce_key.created_at,
    pgonce_key.available_at::timestamptz AS available_at,
    pgonce_key.attempt,
    pgonce_key.lease_until,
    (CASE
        WHEN pgonce_key.lease_until IS NULL AND @channel::text <> ''
            THEN pg_notify(@channel::text, '') IS NOT NULL
        ELSE false
    END)::boolean AS notified,
    coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now,
    (CASE
        WHEN pgonce_key.lease_until IS NOT NULL AND @replicated::boolean
            THEN set_config('synchronous_commit', 'remote_apply', true) = 'remote_apply'
        ELSE false
    END)::boolean AS replicated;

-- name: KeyInsertMany :many
-- KeyInsertMany writes the pending key claims of several calls in one
-- statement, as KeyInsert does for one: a key whose key or scope exists
-- already (a tombstone included) is skipped, and only the inserted keys are
-- returned. The calls come as one array per column, element i of each
-- being call i's, which the driver sends in binary. The arrays are
-- unnested in the select list, not in FROM: one projection instead of a
-- function scan that stores each array's rows first. Set-returning
-- functions in a select list run in lockstep, the shorter ones padded with
-- NULLs, so an optional column that no call sets is sent as a NULL array,
-- which each is coalesced to an empty one of its type: NULL for every
-- call, with no array to encode or decode. The coalesce also leaves the
-- parameter untyped (any) for sqlc, and both outputs pass the Go slice to
-- the driver as is, where a cast would have sqlc's database/sql output
-- wrap it in lib/pq's pq.Array. Rows are inserted in the arrays' order:
-- callers that sort their calls the same way never deadlock on each
-- other's uncommitted keys.
-- Every inserted row notifies the channel, as KeyInsert does, and
-- PostgreSQL delivers a transaction's notifications of the same channel
-- and payload once: one notification covers the whole batch.
INSERT INTO /* TEMPLATE: schema */pgonce_key (
    key,
    scope,
    tenant,
    run_id,
    step,
    business_key,
    tool,
    natural_id,
    fingerprint,
    args,
    metadata,
    delivery,
    key_retention_ms,
    available_at,
    created_at,
    updated_at
)
SELECT
    calls.key,
    calls.scope,
    nullif(calls.tenant, ''),
    nullif(calls.run_id, ''),
    calls.step,
    nullif(calls.business_key, ''),
    calls.tool,
    nullif(calls.natural_id, ''),
    calls.fingerprint,
    calls.args,
    calls.metadata,
    calls.delivery,
    calls.key_retention_ms,
    greatest(
        coalesce(sqlc.narg('now')::timestamptz, now()),
        calls.not_before,
        coalesce(sqlc.narg('now')::timestamptz, now()) + calls.delay_ms * interval '1 millisecond'
    ),
    coalesce(sqlc.narg('now')::timestamptz, now()),
    coalesce(sqlc.narg('now')::timestamptz, now())
FROM (
    SELECT
        unnest(coalesce(@keys, '{}'::bytea[])) AS key,
        unnest(coalesce(@scopes, '{}'::bytea[])) AS scope,
        unnest(coalesce(@tenants, '{}'::text[])) AS tenant,
        unnest(coalesce(@run_ids, '{}'::text[])) AS run_id,
        unnest(coalesce(@steps, '{}'::bigint[])) AS step,
        unnest(coalesce(@business_keys, '{}'::text[])) AS business_key,
        unnest(coalesce(@tools, '{}'::text[])) AS tool,
        unnest(coalesce(@natural_ids, '{}'::text[])) AS natural_id,
        unnest(coalesce(@fingerprints, '{}'::bytea[])) AS fingerprint,
        unnest(coalesce(@args, '{}'::bytea[])) AS args,
        unnest(coalesce(@metadata, '{}'::bytea[])) AS metadata,
        unnest(coalesce(@deliveries, '{}'::smallint[])) AS delivery,
        unnest(coalesce(@key_retention_ms, '{}'::bigint[])) AS key_retention_ms,
        unnest(coalesce(@not_before, '{}'::timestamptz[])) AS not_before,
        unnest(coalesce(@delay_ms, '{}'::bigint[])) AS delay_ms
) AS calls
ON CONFLICT DO NOTHING
RETURNING
    pgonce_key.key,
    pgonce_key.created_at,
    pgonce_key.available_at::timestamptz AS available_at,
    coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now,
    (CASE
        WHEN @channel::text <> '' THEN pg_notify(@channel::text, '') IS NOT NULL
        ELSE false
    END)::boolean AS notified;

-- name: KeyGetByKeyOrScope :one
-- KeyGetByKeyOrScope reads the row that made KeyInsert do nothing: the same
-- key, or another action in the same scope.
SELECT
    pgonce_key.key,
    pgonce_key.scope,
    coalesce(pgonce_key.tenant, '')::text AS tenant,
    coalesce(pgonce_key.run_id, '')::text AS run_id,
    coalesce(pgonce_key.step, 0)::bigint AS step,
    coalesce(pgonce_key.business_key, '')::text AS business_key,
    coalesce(pgonce_key.tool, '')::text AS tool,
    coalesce(pgonce_key.natural_id, '')::text AS natural_id,
    pgonce_key.fingerprint,
    pgonce_key.state::text AS state,
    pgonce_key.attempt,
    pgonce_key.response,
    pgonce_key.failure,
    pgonce_key.created_at,
    coalesce(pgonce_key.updated_at, pgonce_key.completed_at, pgonce_key.created_at)::timestamptz AS updated_at,
    pgonce_key.completed_at,
    pgonce_key.expires_at,
    pgonce_key.forget_at,
    pgonce_key.last_error,
    coalesce(pgonce_key.available_at, pgonce_key.created_at)::timestamptz AS available_at,
    pgonce_key.lease_until,
    pgonce_key.metadata,
    pgonce_key.delivery,
    pgonce_key.key_retention_ms,
    coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
FROM /* TEMPLATE: schema */pgonce_key
WHERE pgonce_key.key = @key::bytea
    OR pgonce_key.scope = @scope::bytea
ORDER BY pgonce_key.key = @key::bytea DESC
LIMIT 1;

-- name: KeyGet :one
-- KeyGet reads a key. now is the database's clock, which retry-after hints
-- are measured against, as KeyGetByKeyOrScope's and KeyInsert's are: the
-- caller's clock may disagree with the one that wrote the row.
SELECT
    pgonce_key.key,
    pgonce_key.scope,
    coalesce(pgonce_key.tenant, '')::text AS tenant,
    coalesce(pgonce_key.run_id, '')::text AS run_id,
    coalesce(pgonce_key.step, 0)::bigint AS step,
    coalesce(pgonce_key.business_key, '')::text AS business_key,
    coalesce(pgonce_key.tool, '')::text AS tool,
    coalesce(pgonce_key.natural_id, '')::text AS natural_id,
    pgonce_key.fingerprint,
    pgonce_key.state::text AS state,
    pgonce_key.attempt,
    pgonce_key.response,
    pgonce_key.failure,
    pgonce_key.created_at,
    coalesce(pgonce_key.updated_at, pgonce_key.completed_at, pgonce_key.created_at)::timestamptz AS updated_at,
    pgonce_key.completed_at,
    pgonce_key.expires_at,
    pgonce_key.forget_at,
    pgonce_key.last_error,
    coalesce(pgonce_key.available_at, pgonce_key.created_at)::timestamptz AS available_at,
    pgonce_key.lease_until,
    pgonce_key.metadata,
    pgonce_key.delivery,
    pgonce_key.key_retention_ms,
    coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
FROM /* TEMPLATE: schema */pgonce_key
WHERE pgonce_key.key = @key::bytea;

-- name: KeyGetByScopes :many
-- KeyGetByScopes reads the keys of scopes, each on the scope's unique
-- index: the steps of a run, whose scopes the caller derives (a tombstone
-- keeps its scope, so a pruned step is found too). scopes is a
-- comma-separated list of scopes in their hex form (not an array: the
-- database/sql output of this file would need lib/pq for one). The columns
-- are KeyGet's; a scope without a key returns no row.
SELECT
    pgonce_key.key,
    pgonce_key.scope,
    coalesce(pgonce_key.tenant, '')::text AS tenant,
    coalesce(pgonce_key.run_id, '')::text AS run_id,
    coalesce(pgonce_key.step, 0)::bigint AS step,
    coalesce(pgonce_key.business_key, '')::text AS business_key,
    coalesce(pgonce_key.tool, '')::text AS tool,
    coalesce(pgonce_key.natural_id, '')::text AS natural_id,
    pgonce_key.fingerprint,
    pgonce_key.state::text AS state,
    pgonce_key.attempt,
    pgonce_key.response,
    pgonce_key.failure,
    pgonce_key.created_at,
    coalesce(pgonce_key.updated_at, pgonce_key.completed_at, pgonce_key.created_at)::timestamptz AS updated_at,
    pgonce_key.completed_at,
    pgonce_key.expires_at,
    pgonce_key.forget_at,
    pgonce_key.last_error,
    coalesce(pgonce_key.available_at, pgonce_key.created_at)::timestamptz AS available_at,
    pgonce_key.lease_until,
    pgonce_key.metadata,
    pgonce_key.delivery,
    pgonce_key.key_retention_ms,
    coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
FROM unnest(string_to_array(@scopes::text, ',')) AS wanted (scope)
JOIN /* TEMPLATE: schema */pgonce_key ON pgonce_key.scope = decode(wanted.scope, 'hex');

-- name: KeyCompleteInTx :one
-- KeyCompleteInTx records the final outcome of a key that the same
-- transaction claimed in flight (KeyInsert with a lease), fenced by its
-- attempt and worker: the claim and its outcome commit together, or
-- neither does. It is a single-row statement without array parameters, so
-- that it runs in a *sql.Tx of the caller as well.
UPDATE /* TEMPLATE: schema */pgonce_key
SET
    state = sqlc.arg('state')::text::/* TEMPLATE: schema */pgonce_state,
    response = sqlc.narg('response')::bytea,
    failure = sqlc.narg('failure')::bytea,
    lease_until = NULL,
    worker = NULL,
    last_error = NULL,
    available_at = NULL,
    updated_at = NULL,
    completed_at = coalesce(sqlc.narg('now')::timestamptz, now()),
    expires_at = coalesce(sqlc.narg('now')::timestamptz, now()) + sqlc.arg('retention_ms')::bigint * interval '1 millisecond',
    forget_at = coalesce(sqlc.narg('now')::timestamptz, now()) + sqlc.arg('tombstone_ms')::bigint * interval '1 millisecond'
WHERE key = sqlc.arg('key')::bytea
    AND attempt = sqlc.arg('attempt')::integer
    AND worker = sqlc.arg('worker')::text
    AND state = 'open'
    AND lease_until IS NOT NULL
RETURNING completed_at;

-- name: KeyFinishInTx :one
-- KeyFinishInTx records the final outcome of a transactional tool's attempt
-- in the transaction that holds the tool's effect, fenced as OutboxFinish
-- fences: only a key still open under a lease at the outcome's attempt is
-- written, and a caller that gets no row rolls its transaction back, effect
-- included. The update locks the key's row until the transaction ends, so a
-- reconciler's reclaim (SKIP LOCKED) passes it by meanwhile. The
-- notification, like the rows, is sent only if the transaction commits. An
-- attempt after the first is kept in pgonce_attempt, as OutboxFinish keeps
-- it, with the claim time and worker that the statement's snapshot still
-- shows. It is a single-row statement without array parameters, so that it
-- runs in a *sql.Tx as well.
WITH updated AS (
    UPDATE /* TEMPLATE: schema */pgonce_key
    SET
        state = sqlc.arg('state')::text::/* TEMPLATE: schema */pgonce_state,
        response = sqlc.narg('response')::bytea,
        failure = sqlc.narg('failure')::bytea,
        lease_until = NULL,
        worker = NULL,
        last_error = NULL,
        available_at = NULL,
        updated_at = NULL,
        completed_at = coalesce(sqlc.narg('now')::timestamptz, now()),
        expires_at = coalesce(sqlc.narg('now')::timestamptz, now()) + sqlc.arg('retention_ms')::bigint * interval '1 millisecond',
        forget_at = coalesce(sqlc.narg('now')::timestamptz, now()) + sqlc.arg('tombstone_ms')::bigint * interval '1 millisecond'
    WHERE pgonce_key.scope = sqlc.arg('scope')::bytea
        AND pgonce_key.key = sqlc.arg('key')::bytea
        AND pgonce_key.attempt = sqlc.arg('attempt')::integer
        AND pgonce_key.state = 'open'
        AND pgonce_key.lease_until IS NOT NULL
    RETURNING
        pgonce_key.key,
        pgonce_key.scope
),
history AS (
    INSERT INTO /* TEMPLATE: schema */pgonce_attempt (
        key,
        attempt,
        started_at,
        ended_at,
        worker,
        outcome
    )
    SELECT
        held.key,
        sqlc.arg('attempt')::integer,
        held.updated_at,
        coalesce(sqlc.narg('now')::timestamptz, now()),
        held.worker,
        sqlc.arg('state')::text
    FROM updated
    JOIN /* TEMPLATE: schema */pgonce_key AS held ON held.scope = updated.scope
    WHERE sqlc.arg('attempt')::integer > 1
        OR sqlc.arg('state')::text <> 'succeeded'
    ON CONFLICT DO NOTHING
)
SELECT
    (CASE
        WHEN @channel::text <> '' THEN pg_notify(@channel::text, 'k1_' || encode(updated.key, 'hex')) IS NOT NULL
        ELSE false
    END)::boolean AS notified
FROM updated;
