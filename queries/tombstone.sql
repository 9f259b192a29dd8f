-- name: TombstoneGet :one
-- TombstoneGet finds the tombstone of a pruned key, by the key or by its scope.
SELECT
    pgonce_tombstone.key,
    pgonce_tombstone.completed_at
FROM pgonce_tombstone
WHERE pgonce_tombstone.key = @key::text
    OR pgonce_tombstone.scope = @scope::text
LIMIT 1;

-- name: TombstonePrune :one
-- TombstonePrune deletes up to max_rows tombstones past their horizon.
WITH doomed AS (
    SELECT pgonce_tombstone.key
    FROM pgonce_tombstone
    WHERE pgonce_tombstone.expires_at < coalesce(sqlc.narg('now')::timestamptz, now())
    ORDER BY pgonce_tombstone.expires_at
    LIMIT @max_rows::integer
    FOR UPDATE SKIP LOCKED
),
deleted AS (
    DELETE FROM pgonce_tombstone
    USING doomed
    WHERE pgonce_tombstone.key = doomed.key
    RETURNING pgonce_tombstone.key
)
SELECT count(*)::bigint AS pruned
FROM deleted;

-- name: TombstoneCountExpired :one
SELECT count(*)::bigint AS expired
FROM pgonce_tombstone
WHERE pgonce_tombstone.expires_at < coalesce(sqlc.narg('now')::timestamptz, now());

-- name: TombstoneCount :one
SELECT count(*)::bigint AS tombstones
FROM pgonce_tombstone;
