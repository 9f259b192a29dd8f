-- name: TombstoneGet :one
-- TombstoneGet finds the tombstone of a pruned key, by the key or by its scope.
SELECT
    pgonce_tombstone.key,
    pgonce_tombstone.completed_at
FROM pgonce_tombstone
WHERE pgonce_tombstone.key = @key::text
    OR pgonce_tombstone.scope = @scope::text
LIMIT 1;
