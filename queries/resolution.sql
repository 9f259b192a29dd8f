-- name: KeyResolve :one
-- KeyResolve applies an operator decision to a key in needs_review, and
-- records it. succeeded and failed store the given bytes and start the
-- retention of the key; retry sends the key back to pending, due now, as a
-- fresh entry of the queue. A key in any other state is left alone and no
-- row returns.
WITH target AS (
    SELECT
        pgonce_key.key,
        pgonce_key.tool,
        pgonce_key.attempt
    FROM /* TEMPLATE: schema */pgonce_key
    WHERE pgonce_key.key = @key::bytea
        AND pgonce_key.state = 'needs_review'
    FOR UPDATE
),
updated AS (
    UPDATE /* TEMPLATE: schema */pgonce_key
    SET
        state = (CASE WHEN @action::text = 'retry' THEN 'open' ELSE @action::text END)::/* TEMPLATE: schema */pgonce_state,
        response = sqlc.narg('response')::bytea,
        failure = sqlc.narg('failure')::bytea,
        -- A retried key is open again, due now; a decided one last changed
        -- when it completed.
        updated_at = CASE WHEN @action::text = 'retry' THEN coalesce(sqlc.narg('now')::timestamptz, now()) END,
        available_at = CASE WHEN @action::text = 'retry' THEN coalesce(sqlc.narg('now')::timestamptz, now()) END,
        ambiguous = false,
        first_attempted_at = NULL,
        completed_at = CASE
            WHEN @action::text = 'retry' THEN NULL
            ELSE coalesce(sqlc.narg('now')::timestamptz, now())
        END,
        expires_at = CASE
            WHEN @action::text = 'retry' THEN NULL
            ELSE coalesce(sqlc.narg('now')::timestamptz, now()) + sqlc.arg('retention_ms')::bigint * interval '1 millisecond'
        END,
        forget_at = CASE
            WHEN @action::text = 'retry' THEN NULL
            ELSE coalesce(sqlc.narg('now')::timestamptz, now()) + sqlc.arg('tombstone_ms')::bigint * interval '1 millisecond'
        END
    FROM target
    WHERE pgonce_key.key = target.key
    RETURNING
        pgonce_key.key,
        pgonce_key.tool,
        pgonce_key.attempt
),
recorded AS (
    INSERT INTO /* TEMPLATE: schema */pgonce_resolution (
        key,
        action,
        resolved_by,
        reason,
        resolved_at
    )
    SELECT
        updated.key,
        @action::text,
        @resolved_by::text,
        @reason::text,
        coalesce(sqlc.narg('now')::timestamptz, now())
    FROM updated
    RETURNING pgonce_resolution.id
),
notified AS (
    SELECT pg_notify(@channel::text, 'k1_' || encode(updated.key, 'hex'))
    FROM updated
    WHERE @channel::text <> ''
)
SELECT
    updated.key,
    (CASE WHEN @action::text = 'retry' THEN 1 ELSE 0 END)::bigint AS queued,
    (SELECT count(*) FROM recorded)::bigint AS recorded,
    (SELECT count(*) FROM notified)::bigint AS notified
FROM updated;

-- name: ResolutionListByKey :many
SELECT
    pgonce_resolution.action,
    pgonce_resolution.resolved_by,
    pgonce_resolution.reason,
    pgonce_resolution.resolved_at
FROM /* TEMPLATE: schema */pgonce_resolution
WHERE pgonce_resolution.key = @key::bytea
ORDER BY pgonce_resolution.resolved_at, pgonce_resolution.id;

-- name: KeyCancel :one
-- KeyCancel cancels a pending key and records who did it and why: the key
-- becomes final (cancelled), its retention starts, and every duplicate
-- replays the cancellation. Only a pending key is cancelled: the row lock
-- orders the cancel against a claim, and under READ COMMITTED a cancel that
-- waited on a claim re-reads the row, finds its lease and leaves it alone,
-- so an in-flight key is never touched. Any other state returns no row.
WITH target AS (
    SELECT pgonce_key.key
    FROM /* TEMPLATE: schema */pgonce_key
    WHERE pgonce_key.key = @key::bytea
        AND pgonce_key.state = 'open'
        AND pgonce_key.lease_until IS NULL
    FOR UPDATE
),
updated AS (
    UPDATE /* TEMPLATE: schema */pgonce_key
    SET
        state = 'cancelled',
        available_at = NULL,
        updated_at = NULL,
        completed_at = coalesce(sqlc.narg('now')::timestamptz, now()),
        expires_at = coalesce(sqlc.narg('now')::timestamptz, now()) + sqlc.arg('retention_ms')::bigint * interval '1 millisecond',
        forget_at = coalesce(sqlc.narg('now')::timestamptz, now()) + sqlc.arg('tombstone_ms')::bigint * interval '1 millisecond'
    FROM target
    WHERE pgonce_key.key = target.key
        AND pgonce_key.state = 'open'
        AND pgonce_key.lease_until IS NULL
    RETURNING pgonce_key.key
),
recorded AS (
    INSERT INTO /* TEMPLATE: schema */pgonce_resolution (
        key,
        action,
        resolved_by,
        reason,
        resolved_at
    )
    SELECT
        updated.key,
        'cancel',
        @resolved_by::text,
        @reason::text,
        coalesce(sqlc.narg('now')::timestamptz, now())
    FROM updated
    RETURNING pgonce_resolution.id
),
notified AS (
    SELECT pg_notify(@channel::text, 'k1_' || encode(updated.key, 'hex'))
    FROM updated
    WHERE @channel::text <> ''
)
SELECT
    updated.key,
    (SELECT count(*) FROM recorded)::bigint AS recorded,
    (SELECT count(*) FROM notified)::bigint AS notified
FROM updated;

-- name: KeyRetry :one
-- KeyRetry sends a failed or cancelled key back to pending, due now, and
-- records who did it and why: the stored failure is dropped, the retention
-- stops, and the next claim takes the key under a new attempt. Any other
-- state returns no row: a pending or in-flight key is never touched.
WITH target AS (
    SELECT pgonce_key.key
    FROM /* TEMPLATE: schema */pgonce_key
    WHERE pgonce_key.key = @key::bytea
        AND pgonce_key.state IN ('failed', 'cancelled')
    FOR UPDATE
),
updated AS (
    UPDATE /* TEMPLATE: schema */pgonce_key
    SET
        state = 'open',
        failure = NULL,
        available_at = coalesce(sqlc.narg('now')::timestamptz, now()),
        updated_at = coalesce(sqlc.narg('now')::timestamptz, now()),
        ambiguous = false,
        first_attempted_at = NULL,
        completed_at = NULL,
        expires_at = NULL,
        forget_at = NULL
    FROM target
    WHERE pgonce_key.key = target.key
        AND pgonce_key.state IN ('failed', 'cancelled')
    RETURNING pgonce_key.key
),
recorded AS (
    INSERT INTO /* TEMPLATE: schema */pgonce_resolution (
        key,
        action,
        resolved_by,
        reason,
        resolved_at
    )
    SELECT
        updated.key,
        'retry',
        @resolved_by::text,
        @reason::text,
        coalesce(sqlc.narg('now')::timestamptz, now())
    FROM updated
    RETURNING pgonce_resolution.id
),
notified AS (
    SELECT pg_notify(@channel::text, '')
    FROM updated
    WHERE @channel::text <> ''
)
SELECT
    updated.key,
    (SELECT count(*) FROM recorded)::bigint AS recorded,
    (SELECT count(*) FROM notified)::bigint AS notified
FROM updated;

-- name: KeySettleReview :one
-- KeySettleReview records the outcome that the provider answered to the
-- given attempt, when that answer reached the store only after the
-- reconciler had taken the attempt over (its lease ran out while the worker
-- was starved of CPU, or while the network held its record): the key is
-- still at the reconciler's attempt, the one after the given one (no
-- attempt since), and the given attempt ended lease_expired; and either the
-- reconciler sent the key to review for want of the outcome (review_reason;
-- nobody resolved it since, or it would not be in review), or it holds the
-- key still, undecided. The reconciler never calls a provider, so the given
-- attempt's call is the last the key made, and its answer is the key's
-- outcome; a reconciler that decides later is fenced out. Every condition
-- but the attempt history's (written when the key was taken over) is on the
-- key's row, in the update itself, so that a concurrent decision (an
-- operator's, the reconciler's) is seen as it commits. The settlement is
-- recorded in pgonce_resolution and notified as OutboxFinish notifies; any
-- other key is left alone and no row returns.
WITH updated AS (
    UPDATE /* TEMPLATE: schema */pgonce_key
    SET
        state = (@state::text)::/* TEMPLATE: schema */pgonce_state,
        response = sqlc.narg('response')::bytea,
        failure = sqlc.narg('failure')::bytea,
        lease_until = NULL,
        worker = NULL,
        available_at = NULL,
        last_error = nullif(@last_error::text, ''),
        updated_at = NULL,
        completed_at = coalesce(sqlc.narg('now')::timestamptz, now()),
        expires_at = coalesce(sqlc.narg('now')::timestamptz, now()) + sqlc.arg('retention_ms')::bigint * interval '1 millisecond',
        forget_at = coalesce(sqlc.narg('now')::timestamptz, now()) + sqlc.arg('tombstone_ms')::bigint * interval '1 millisecond'
    WHERE pgonce_key.key = @key::bytea
        AND @state::text IN ('succeeded', 'failed')
        AND pgonce_key.attempt - 1 = @attempt::integer
        AND (
            (pgonce_key.state = 'needs_review' AND pgonce_key.last_error = @review_reason::text)
            OR (pgonce_key.state = 'open' AND pgonce_key.lease_until IS NOT NULL)
        )
        AND EXISTS (
            SELECT 1
            FROM /* TEMPLATE: schema */pgonce_attempt
            WHERE pgonce_attempt.key = pgonce_key.key
                AND pgonce_attempt.attempt = @attempt::integer
                AND pgonce_attempt.outcome = 'lease_expired'
        )
    RETURNING pgonce_key.key
),
recorded AS (
    INSERT INTO /* TEMPLATE: schema */pgonce_resolution (
        key,
        action,
        resolved_by,
        reason,
        resolved_at
    )
    SELECT
        updated.key,
        @state::text,
        @resolved_by::text,
        @reason::text,
        coalesce(sqlc.narg('now')::timestamptz, now())
    FROM updated
    RETURNING pgonce_resolution.id
),
notified AS (
    SELECT pg_notify(@channel::text, 'k1_' || encode(updated.key, 'hex'))
    FROM updated
    WHERE @channel::text <> ''
)
SELECT
    updated.key,
    (SELECT count(*) FROM recorded)::bigint AS recorded,
    (SELECT count(*) FROM notified)::bigint AS notified
FROM updated;
