-- The outbox is the set of open keys: a pending key has no lease, an
-- in-flight key has one. These statements are the queue's, over pgonce_key.

-- name: OutboxClaimBatch :many
-- OutboxClaimBatch claims up to max due pending keys of the given tools,
-- longest due first: it marks them in flight under a lease that ends by the
-- database clock, and returns what the provider call needs. SKIP LOCKED lets
-- any number of dispatchers claim side by side without waiting on each
-- other. Each tool is read from its own part of the due index, so keys of
-- tools this dispatcher does not serve cost it nothing however many wait.
-- Keys locked for one tool but beyond the batch are released when the
-- statement commits.
WITH due AS (
    SELECT candidate.scope
    FROM unnest(@tools::text[]) AS served (tool)
    CROSS JOIN LATERAL (
        SELECT
            pgonce_key.scope,
            pgonce_key.available_at
        FROM /* TEMPLATE: schema */pgonce_key
        WHERE pgonce_key.tool = served.tool
            AND pgonce_key.state = 'open'
            AND pgonce_key.lease_until IS NULL
            AND pgonce_key.available_at <= coalesce(sqlc.narg('now')::timestamptz, now())
        ORDER BY pgonce_key.available_at
        LIMIT @max_rows::integer
        FOR UPDATE SKIP LOCKED
    ) AS candidate
    ORDER BY candidate.available_at
    LIMIT @max_rows::integer
),
claimed AS (
    UPDATE /* TEMPLATE: schema */pgonce_key
    SET
        attempt = pgonce_key.attempt + 1,
        lease_until = coalesce(sqlc.narg('now')::timestamptz, now()) + sqlc.arg('lease_ms')::bigint * interval '1 millisecond',
        worker = @worker::text,
        first_attempted_at = coalesce(pgonce_key.first_attempted_at, sqlc.narg('now')::timestamptz, now()),
        -- An in-flight key last changed when its attempt claimed it: the
        -- attempt's start, which pgonce_attempt keeps if the attempt does
        -- not finish the key.
        updated_at = coalesce(sqlc.narg('now')::timestamptz, now())
    FROM due
    -- Rows are matched on the unique scope, as in OutboxFinish.
    WHERE pgonce_key.scope = due.scope
    RETURNING
        pgonce_key.key,
        pgonce_key.scope,
        pgonce_key.tool,
        pgonce_key.attempt,
        pgonce_key.ambiguous,
        pgonce_key.first_attempted_at,
        pgonce_key.lease_until,
        pgonce_key.natural_id,
        pgonce_key.args,
        pgonce_key.metadata,
        pgonce_key.available_at
)
SELECT
    claimed.key,
    claimed.scope,
    coalesce(claimed.tool, '')::text AS tool,
    claimed.attempt,
    claimed.ambiguous,
    claimed.first_attempted_at::timestamptz AS first_attempted_at,
    claimed.lease_until::timestamptz AS lease_until,
    coalesce(claimed.natural_id, '')::text AS natural_id,
    claimed.args,
    claimed.metadata,
    -- available_at is when the key became due (a claim leaves it as it
    -- was): how long it waited for the claim is now minus it.
    claimed.available_at::timestamptz AS available_at,
    -- now is the database's clock at the claim: the worker measures time
    -- since first_attempted_at from it, never from its own clock.
    coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now,
    -- replicated: a key of a tool in replicated_tools makes the claim's
    -- commit wait until the synchronous standbys applied it
    -- (ToolOpts.ReplicatedClaim). synchronous_commit is read at COMMIT, and
    -- a local setting lasts until then, in the implicit transaction of this
    -- one statement too; CASE runs set_config only for such keys.
    (CASE
        WHEN claimed.tool = ANY(@replicated_tools::text[])
            THEN set_config('synchronous_commit', 'remote_apply', true) = 'remote_apply'
        ELSE false
    END)::boolean AS replicated
FROM claimed
ORDER BY claimed.key;

-- name: OutboxClaimKey :one
-- OutboxClaimKey claims one pending key for the inline path. A concurrent
-- claimer waits on the row lock, then finds the lease taken and gets no row.
-- now is the database's clock at the claim, as in OutboxClaimBatch. A key
-- never attempted is claimed only once due, so that a submit's not-before
-- time holds for Do too; a key waiting out a backoff is claimed at once
-- (the caller asked now). With replicated set, the claim's commit waits
-- until the synchronous standbys applied it, as in OutboxClaimBatch.
UPDATE /* TEMPLATE: schema */pgonce_key
SET
    attempt = pgonce_key.attempt + 1,
    lease_until = coalesce(sqlc.narg('now')::timestamptz, now()) + sqlc.arg('lease_ms')::bigint * interval '1 millisecond',
    worker = @worker::text,
    first_attempted_at = coalesce(pgonce_key.first_attempted_at, sqlc.narg('now')::timestamptz, now()),
    updated_at = coalesce(sqlc.narg('now')::timestamptz, now())
WHERE pgonce_key.key = @key::bytea
    AND pgonce_key.state = 'open'
    AND pgonce_key.lease_until IS NULL
    AND (pgonce_key.attempt > 0 OR pgonce_key.available_at <= coalesce(sqlc.narg('now')::timestamptz, now()))
RETURNING
    pgonce_key.attempt,
    pgonce_key.ambiguous,
    pgonce_key.first_attempted_at::timestamptz AS first_attempted_at,
    pgonce_key.lease_until::timestamptz AS lease_until,
    pgonce_key.metadata,
    coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now,
    (CASE
        WHEN @replicated::boolean
            THEN set_config('synchronous_commit', 'remote_apply', true) = 'remote_apply'
        ELSE false
    END)::boolean AS replicated;

-- name: OutboxRelease :many
-- OutboxRelease puts attempts that may be tried again back to pending, after
-- their backoff, several at once. Each release is fenced by its attempt, as
-- in OutboxFinish. ambiguous records that the attempt may have acted, so
-- that the next one reads before it writes.
WITH released AS (
    SELECT
        unnest(@key::bytea[]) AS key,
        unnest(@scope::bytea[]) AS scope,
        unnest(@attempt::integer[]) AS attempt,
        unnest(@delay_ms::bigint[]) AS delay_ms,
        unnest(@ambiguous::boolean[]) AS ambiguous,
        unnest(@last_error::text[]) AS last_error
),
updated AS (
    UPDATE /* TEMPLATE: schema */pgonce_key
    SET
        lease_until = NULL,
        worker = NULL,
        available_at = coalesce(sqlc.narg('now')::timestamptz, now()) + released.delay_ms * interval '1 millisecond',
        ambiguous = released.ambiguous,
        last_error = released.last_error,
        updated_at = coalesce(sqlc.narg('now')::timestamptz, now())
    FROM released
    -- The match and the fence of OutboxFinish, for the same reasons.
    WHERE pgonce_key.scope = released.scope
        AND pgonce_key.key = released.key
        AND pgonce_key.attempt = CASE
            WHEN pgonce_key.state = 'open' AND pgonce_key.lease_until IS NOT NULL THEN released.attempt
        END
    RETURNING
        pgonce_key.key,
        pgonce_key.scope,
        released.ambiguous,
        released.last_error
),
-- A released attempt did not finish its key: pgonce_attempt keeps it, with
-- its claim time and worker from the row as the attempt left it (every part
-- of the statement reads one snapshot, so held sees the row before updated
-- changed it; the fence made sure no other writer came in between).
history AS (
    INSERT INTO /* TEMPLATE: schema */pgonce_attempt (
        key,
        attempt,
        started_at,
        ended_at,
        worker,
        outcome,
        error
    )
    SELECT
        held.key,
        held.attempt,
        held.updated_at,
        coalesce(sqlc.narg('now')::timestamptz, now()),
        held.worker,
        CASE WHEN updated.ambiguous THEN 'uncertain' ELSE 'retry' END,
        nullif(updated.last_error, '')
    FROM updated
    JOIN /* TEMPLATE: schema */pgonce_key AS held ON held.scope = updated.scope
    ON CONFLICT DO NOTHING
),
notified AS (
    SELECT pg_notify(@channel::text, '')
    FROM updated
    WHERE @channel::text <> ''
    LIMIT 1
)
SELECT
    updated.key,
    (SELECT count(*) FROM notified)::bigint AS notified
FROM updated;

-- name: OutboxFinish :many
-- OutboxFinish records the outcomes of finished attempts, several at once,
-- given as parallel arrays. Each outcome is fenced by its attempt: only a
-- key that is still open and still holds that attempt under a lease is
-- written, so a late writer whose lease was taken over changes nothing.
-- Recording the outcome takes the key off the queue. Terminal outcomes
-- start the retention of the key; needs_review keeps the key without one.
WITH outcome AS (
    SELECT
        unnest(@key::bytea[]) AS key,
        unnest(@scope::bytea[]) AS scope,
        unnest(@attempt::integer[]) AS attempt,
        unnest(@state::text[]) AS state,
        unnest(@response::bytea[]) AS response,
        unnest(@failure::bytea[]) AS failure,
        unnest(@retention_ms::bigint[]) AS retention_ms,
        unnest(@last_error::text[]) AS last_error
),
updated AS (
    UPDATE /* TEMPLATE: schema */pgonce_key
    SET
        state = outcome.state::/* TEMPLATE: schema */pgonce_state,
        response = outcome.response,
        failure = outcome.failure,
        lease_until = NULL,
        worker = NULL,
        last_error = nullif(outcome.last_error, ''),
        available_at = NULL,
        -- A finished key last changed when it completed; a key that went
        -- to review changed now.
        updated_at = CASE
            WHEN outcome.state = 'needs_review' THEN coalesce(sqlc.narg('now')::timestamptz, now())
        END,
        completed_at = CASE
            WHEN outcome.state IN ('succeeded', 'failed') THEN coalesce(sqlc.narg('now')::timestamptz, now())
        END,
        expires_at = CASE
            WHEN outcome.state IN ('succeeded', 'failed')
                THEN coalesce(sqlc.narg('now')::timestamptz, now()) + outcome.retention_ms * interval '1 millisecond'
        END,
        forget_at = CASE
            WHEN outcome.state IN ('succeeded', 'failed')
                THEN coalesce(sqlc.narg('now')::timestamptz, now()) + sqlc.arg('tombstone_ms')::bigint * interval '1 millisecond'
        END
    FROM outcome
    -- Each outcome's row is found through the unique scope: the planner
    -- knows a scope matches one row even on a table it has no statistics
    -- for. The key's own index is a hash index, which says nothing of
    -- uniqueness: without statistics a match on it was estimated at 0.5 %
    -- of the table, and a batch of outcomes was joined to the table by
    -- reading all of it (30-97 ms a batch at 10^5 keys;
    -- TestDispatchPlansNeverScanTheKeyTable). The key must match too: a
    -- scope whose tombstone was forgotten may hold another key since.
    WHERE pgonce_key.scope = outcome.scope
        AND pgonce_key.key = outcome.key
        -- The fence: the row still holds the outcome's attempt, open under
        -- a lease. It is one condition on the row and its outcome together,
        -- not filters on the row alone, so that the planner finds each
        -- outcome's row through the scope index at any table size. Given
        -- filters of its own, the table looked one row small whenever its
        -- statistics were taken with nothing in flight, and the planner
        -- drove the join from it, rescanning every outcome for each leased
        -- row: quadratic in the batch (53 ms for 256 outcomes, against
        -- 5–8 ms; TestBatchesProbeTheScopeIndex).
        AND pgonce_key.attempt = CASE
            WHEN pgonce_key.state = 'open' AND pgonce_key.lease_until IS NOT NULL THEN outcome.attempt
        END
    RETURNING
        pgonce_key.key,
        pgonce_key.scope,
        outcome.attempt,
        outcome.state,
        outcome.last_error
),
-- The attempts of keys that did not succeed the first time are kept in
-- pgonce_attempt, as in OutboxRelease; a key that succeeded at its first
-- attempt, nearly every key, writes nothing there and reads no row for it.
history AS (
    INSERT INTO /* TEMPLATE: schema */pgonce_attempt (
        key,
        attempt,
        started_at,
        ended_at,
        worker,
        outcome,
        error
    )
    SELECT
        held.key,
        held.attempt,
        held.updated_at,
        coalesce(sqlc.narg('now')::timestamptz, now()),
        held.worker,
        updated.state,
        nullif(updated.last_error, '')
    FROM updated
    JOIN /* TEMPLATE: schema */pgonce_key AS held ON held.scope = updated.scope
    WHERE updated.state <> 'succeeded'
        OR updated.attempt > 1
    ON CONFLICT DO NOTHING
),
-- One notification carries up to 100 comma-separated keys in their text
-- form (k1_<hex>), well within the 8000-byte payload limit: a notification
-- per key would make a batch pay for each.
notified AS (
    SELECT pg_notify(@channel::text, string_agg('k1_' || encode(numbered.key, 'hex'), ','))
    FROM (
        SELECT
            updated.key,
            (row_number() OVER () - 1) / 100 AS chunk
        FROM updated
    ) AS numbered
    WHERE @channel::text <> ''
    GROUP BY numbered.chunk
)
SELECT
    updated.key,
    (SELECT count(*) FROM notified)::bigint AS notified
FROM updated;

-- name: OutboxCountUnserved :many
-- OutboxCountUnserved counts pending keys, per tool, of tools outside the
-- given list that have waited longer than the given age: work nobody serves.
SELECT
    coalesce(pgonce_key.tool, '')::text AS tool,
    count(*)::bigint AS waiting,
    min(pgonce_key.created_at)::timestamptz AS oldest
FROM /* TEMPLATE: schema */pgonce_key
WHERE pgonce_key.state = 'open'
    AND pgonce_key.lease_until IS NULL
    AND NOT (pgonce_key.tool = any(@tools::text[]))
    AND pgonce_key.created_at < coalesce(sqlc.narg('now')::timestamptz, now()) - sqlc.arg('age_ms')::bigint * interval '1 millisecond'
GROUP BY pgonce_key.tool
ORDER BY pgonce_key.tool;

-- name: OutboxReclaimExpired :many
-- OutboxReclaimExpired takes in-flight keys whose lease ended more than
-- grace ago (a worker crashed, or an attempt ended with nobody to record it)
-- for the reconciler: it leases them to the reconciler under a new attempt,
-- which fences out the worker that held them, and returns them. SKIP LOCKED
-- keeps concurrent reconcilers off each other's keys, and a live lease is
-- never touched.
WITH expired AS (
    SELECT
        pgonce_key.key,
        pgonce_key.scope,
        pgonce_key.attempt,
        pgonce_key.updated_at,
        pgonce_key.worker
    FROM /* TEMPLATE: schema */pgonce_key
    WHERE pgonce_key.lease_until IS NOT NULL
        AND pgonce_key.lease_until < coalesce(sqlc.narg('now')::timestamptz, now()) - sqlc.arg('grace_ms')::bigint * interval '1 millisecond'
        AND pgonce_key.tool = any(@tools::text[])
    ORDER BY pgonce_key.lease_until
    LIMIT @max_rows::integer
    FOR UPDATE SKIP LOCKED
),
reclaimed AS (
    UPDATE /* TEMPLATE: schema */pgonce_key
    SET
        attempt = pgonce_key.attempt + 1,
        lease_until = coalesce(sqlc.narg('now')::timestamptz, now()) + sqlc.arg('lease_ms')::bigint * interval '1 millisecond',
        worker = @worker::text,
        updated_at = coalesce(sqlc.narg('now')::timestamptz, now())
    FROM expired
    -- Rows are matched on the unique scope, as in OutboxFinish.
    WHERE pgonce_key.scope = expired.scope
    RETURNING
        pgonce_key.key,
        pgonce_key.scope,
        pgonce_key.tool,
        pgonce_key.attempt,
        pgonce_key.first_attempted_at,
        pgonce_key.natural_id,
        pgonce_key.args,
        pgonce_key.metadata,
        pgonce_key.delivery,
        pgonce_key.key_retention_ms
),
-- The attempt whose lease ran out ends here, without an outcome of its own:
-- pgonce_attempt keeps it, with the claim time and worker it had.
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
        expired.key,
        expired.attempt,
        expired.updated_at,
        coalesce(sqlc.narg('now')::timestamptz, now()),
        expired.worker,
        'lease_expired'
    FROM reclaimed
    JOIN expired ON expired.scope = reclaimed.scope
    ON CONFLICT DO NOTHING
)
SELECT
    reclaimed.key,
    reclaimed.scope,
    coalesce(reclaimed.tool, '')::text AS tool,
    reclaimed.attempt,
    reclaimed.first_attempted_at::timestamptz AS first_attempted_at,
    coalesce(reclaimed.natural_id, '')::text AS natural_id,
    reclaimed.args,
    reclaimed.metadata,
    reclaimed.delivery,
    reclaimed.key_retention_ms,
    -- now is the database's clock at the reclaim, as in OutboxClaimBatch.
    coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
FROM reclaimed
ORDER BY reclaimed.key;

-- name: OutboxCountExpired :many
-- OutboxCountExpired counts, per tool, in-flight keys past lease and grace
-- of tools outside the given list: keys the reconciler skips.
SELECT
    coalesce(pgonce_key.tool, '')::text AS tool,
    count(*)::bigint AS expired
FROM /* TEMPLATE: schema */pgonce_key
WHERE pgonce_key.lease_until IS NOT NULL
    AND pgonce_key.lease_until < coalesce(sqlc.narg('now')::timestamptz, now()) - sqlc.arg('grace_ms')::bigint * interval '1 millisecond'
    AND NOT (pgonce_key.tool = any(@tools::text[]))
GROUP BY pgonce_key.tool
ORDER BY pgonce_key.tool;

-- name: OutboxCountStalePending :one
-- OutboxCountStalePending counts pending keys due for longer than the given
-- age: work no dispatcher picks up.
SELECT
    count(*)::bigint AS stale,
    coalesce(
        extract(epoch FROM coalesce(sqlc.narg('now')::timestamptz, now()) - min(pgonce_key.available_at)) * 1000,
        0
    )::bigint AS oldest_age_ms
FROM /* TEMPLATE: schema */pgonce_key
WHERE pgonce_key.state = 'open'
    AND pgonce_key.lease_until IS NULL
    AND pgonce_key.available_at < coalesce(sqlc.narg('now')::timestamptz, now()) - sqlc.arg('age_ms')::bigint * interval '1 millisecond';

-- name: OutboxGet :one
-- OutboxGet reads the queue fields of an open key.
SELECT
    pgonce_key.attempt,
    coalesce(pgonce_key.available_at, pgonce_key.created_at)::timestamptz AS available_at,
    pgonce_key.lease_until,
    pgonce_key.worker,
    pgonce_key.first_attempted_at,
    pgonce_key.ambiguous,
    pgonce_key.last_error
FROM /* TEMPLATE: schema */pgonce_key
WHERE pgonce_key.key = @key::bytea
    AND pgonce_key.state = 'open';

-- name: OutboxStats :one
-- OutboxStats summarises the queue for operators: how many keys are pending
-- and in flight, how long the oldest due pending key has waited, and how
-- many in-flight keys hold an expired lease. Each count reads a partial
-- index of open keys, never the finished ones.
SELECT
    (
        SELECT count(*)
        FROM /* TEMPLATE: schema */pgonce_key
        WHERE pgonce_key.state = 'open'
            AND pgonce_key.lease_until IS NULL
    )::bigint AS pending,
    (
        SELECT count(*)
        FROM /* TEMPLATE: schema */pgonce_key
        WHERE pgonce_key.lease_until IS NOT NULL
    )::bigint AS in_flight,
    (
        SELECT count(*)
        FROM /* TEMPLATE: schema */pgonce_key
        WHERE pgonce_key.lease_until IS NOT NULL
            AND pgonce_key.lease_until < coalesce(sqlc.narg('now')::timestamptz, now())
    )::bigint AS expired_leases,
    coalesce((
        SELECT extract(epoch FROM coalesce(sqlc.narg('now')::timestamptz, now()) - min(pgonce_key.available_at)) * 1000
        FROM /* TEMPLATE: schema */pgonce_key
        WHERE pgonce_key.state = 'open'
            AND pgonce_key.lease_until IS NULL
            AND pgonce_key.available_at <= coalesce(sqlc.narg('now')::timestamptz, now())
    ), 0)::bigint AS oldest_pending_ms;

-- name: OutboxRecordedAttempts :many
-- OutboxRecordedAttempts returns which of the given keys hold no lease at
-- the given attempt: that attempt's outcome was recorded, since a claim
-- always moves the attempt on and only the attempt's holder ends its lease.
-- A recorder whose statement ran but whose reply was lost (the connection
-- died on the way back) finds its retry writes nothing, and reads here what
-- the lost statement wrote.
WITH given AS (
    SELECT
        unnest(@key::bytea[]) AS key,
        unnest(@scope::bytea[]) AS scope,
        unnest(@attempt::integer[]) AS attempt
)
SELECT pgonce_key.key
FROM /* TEMPLATE: schema */pgonce_key
-- Matched on the unique scope, as in OutboxFinish.
JOIN given ON pgonce_key.scope = given.scope
    AND pgonce_key.key = given.key
    AND pgonce_key.attempt = given.attempt
WHERE pgonce_key.lease_until IS NULL
ORDER BY pgonce_key.key;

-- name: OutboxExtendLease :one
-- OutboxExtendLease extends the lease of a key still held by the given
-- attempt to lease from now, never shortening it, and returns the new end;
-- no row when the attempt no longer holds the key (the fence of
-- OutboxFinish). A worker extends its lease before it records an outcome
-- whose bytes take long to send, so that the reconciler does not take the
-- key over while they are on their way.
UPDATE /* TEMPLATE: schema */pgonce_key
SET
    lease_until = greatest(
        pgonce_key.lease_until,
        coalesce(sqlc.narg('now')::timestamptz, now()) + sqlc.arg('lease_ms')::bigint * interval '1 millisecond'
    )
WHERE pgonce_key.key = @key::bytea
    AND pgonce_key.attempt = CASE
        WHEN pgonce_key.state = 'open' AND pgonce_key.lease_until IS NOT NULL THEN @attempt::integer
    END
RETURNING pgonce_key.lease_until::timestamptz AS lease_until;
