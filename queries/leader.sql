-- name: LeaderElect :one
-- LeaderElect makes @leader_id the holder of leadership @name until @ttl_ms
-- from now: it takes a free leadership, renews one it holds, and takes over
-- one whose lease expired. A leadership another holds under a live lease is
-- left alone and no row returns. elected_at stays put while the same holder
-- renews.
INSERT INTO /* TEMPLATE: schema */pgonce_leader AS leader (
    name,
    leader_id,
    elected_at,
    expires_at
) VALUES (
    @name::text,
    @leader_id::text,
    coalesce(sqlc.narg('now')::timestamptz, now()),
    coalesce(sqlc.narg('now')::timestamptz, now()) + sqlc.arg('ttl_ms')::bigint * interval '1 millisecond'
)
ON CONFLICT (name) DO UPDATE
SET
    leader_id = excluded.leader_id,
    elected_at = CASE
        WHEN leader.leader_id = excluded.leader_id THEN leader.elected_at
        ELSE excluded.elected_at
    END,
    expires_at = excluded.expires_at
WHERE leader.leader_id = excluded.leader_id
    OR leader.expires_at <= excluded.elected_at
RETURNING
    leader.elected_at,
    leader.expires_at;

-- name: LeaderResign :execrows
-- LeaderResign gives up leadership @name if @leader_id holds it, so that
-- another candidate takes over at its next attempt rather than after the
-- lease.
DELETE FROM /* TEMPLATE: schema */pgonce_leader
WHERE name = @name::text
    AND leader_id = @leader_id::text;

-- name: LeaderGet :one
-- LeaderGet reads who holds leadership @name, live or not.
SELECT
    leader_id,
    elected_at,
    expires_at,
    expires_at > coalesce(sqlc.narg('now')::timestamptz, now()) AS live
FROM /* TEMPLATE: schema */pgonce_leader
WHERE name = @name::text;
