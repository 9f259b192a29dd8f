-- name: ExpiryRun :one
-- ExpiryRun applies retention to up to max_rows keys whose scheduled time has
-- come, oldest first. A finished key past its retention becomes a tombstone,
-- in place: the response, failure and arguments go; the key, scope, identity
-- and completion time stay, and so do the unique index entries, so a
-- concurrent or late duplicate conflicts with the tombstone and never runs.
-- Its schedule moves to the horizon fixed when the key finished (forget_at).
-- A tombstone past that horizon is deleted with its schedule; only then can
-- the same action run again. SKIP LOCKED lets it run beside anything else,
-- and small batches keep locks short. Every CTE sees the statement's
-- snapshot, so a key is never expired and deleted in the same run.
WITH due AS (
    SELECT
        pgonce_expiry.expires_at,
        pgonce_expiry.key
    FROM pgonce_expiry
    WHERE pgonce_expiry.expires_at < coalesce(sqlc.narg('now')::timestamptz, now())
    ORDER BY pgonce_expiry.expires_at
    LIMIT @max_rows::integer
    FOR UPDATE SKIP LOCKED
),
expired AS (
    UPDATE pgonce_key
    SET
        state = 'expired',
        response = NULL,
        failure = NULL,
        args = ''::bytea,
        last_error = NULL,
        updated_at = coalesce(sqlc.narg('now')::timestamptz, now()),
        expires_at = greatest(pgonce_key.forget_at, coalesce(sqlc.narg('now')::timestamptz, now()))
    FROM due
    WHERE pgonce_key.key = due.key
        AND pgonce_key.state IN ('succeeded', 'failed')
    RETURNING
        pgonce_key.key,
        pgonce_key.expires_at
),
rescheduled AS (
    UPDATE pgonce_expiry
    SET expires_at = expired.expires_at
    FROM due
    JOIN expired ON expired.key = due.key
    WHERE pgonce_expiry.expires_at = due.expires_at
        AND pgonce_expiry.key = due.key
    RETURNING pgonce_expiry.key
),
forgotten AS (
    DELETE FROM pgonce_key
    USING due
    WHERE pgonce_key.key = due.key
        AND pgonce_key.state = 'expired'
    RETURNING pgonce_key.key
),
unscheduled AS (
    DELETE FROM pgonce_expiry
    USING due
    WHERE pgonce_expiry.expires_at = due.expires_at
        AND pgonce_expiry.key = due.key
        AND NOT EXISTS (SELECT 1 FROM expired WHERE expired.key = due.key)
    RETURNING pgonce_expiry.key
)
SELECT
    (SELECT count(*) FROM due)::bigint AS due,
    (SELECT count(*) FROM expired)::bigint AS expired,
    (SELECT count(*) FROM forgotten)::bigint AS forgotten,
    (SELECT count(*) FROM rescheduled)::bigint AS rescheduled,
    (SELECT count(*) FROM unscheduled)::bigint AS unscheduled;

-- name: ExpiryCountDue :one
-- ExpiryCountDue counts what ExpiryRun would do now, for a dry run.
SELECT
    count(*) FILTER (WHERE pgonce_key.state IN ('succeeded', 'failed'))::bigint AS expirable,
    count(*) FILTER (WHERE pgonce_key.state = 'expired')::bigint AS forgettable
FROM pgonce_expiry
JOIN pgonce_key ON pgonce_key.key = pgonce_expiry.key
WHERE pgonce_expiry.expires_at < coalesce(sqlc.narg('now')::timestamptz, now());
