-- The statements an operator's search runs (Client.Search), and the counts
-- and lists of recent keys. A window of recent keys is read through the
-- BRIN index on created_at (pgonce_key_created_at_idx); keys older than
-- the window are searched only among those an operator lists (every state
-- but succeeded and expired), on pgonce_key_list_idx.

-- name: KeyGetDetails :one
-- KeyGetDetails reads what an inspection adds to KeyGet: the canonical
-- arguments, when the key was first attempted, and a tombstone's final
-- state.
SELECT
    pgonce_key.args,
    pgonce_key.first_attempted_at,
    coalesce(pgonce_key.expired_state::text, '')::text AS expired_state
FROM /* TEMPLATE: schema */pgonce_key
WHERE pgonce_key.key = @key::bytea;

-- name: KeySearch :many
-- KeySearch finds keys created in [since, before) (the window), and keys
-- older than the window that an operator lists, whose business key or
-- natural id is the given one, whose key's hex digits begin with
-- key_prefix, whose canonical arguments contain args_needle, or whose
-- metadata (a JSON object as encoding/json writes it) contains
-- metadata_needle; an empty criterion matches nothing. Bytes are matched
-- with position, never LIKE, so that no byte of a needle is a wildcard. tenant, when not NULL, keeps only its keys.
-- Newest first, up to max_rows. The two parts read disjoint keys (the
-- window's, the older listable ones), so no key is found twice.
SELECT
    found.key,
    found.state::text AS state,
    coalesce(found.tenant, '')::text AS tenant,
    coalesce(found.run_id, '')::text AS run_id,
    coalesce(found.step, 0)::bigint AS step,
    coalesce(found.business_key, '')::text AS business_key,
    coalesce(found.tool, '')::text AS tool,
    coalesce(found.natural_id, '')::text AS natural_id,
    found.attempt,
    found.created_at,
    coalesce(found.updated_at, found.completed_at, found.created_at)::timestamptz AS updated_at,
    found.completed_at,
    coalesce(found.available_at, found.created_at)::timestamptz AS available_at,
    found.lease_until,
    found.last_error,
    substring(found.args FROM 1 FOR @args_bytes::integer)::bytea AS args_head,
    coalesce(octet_length(found.args), 0)::integer AS args_size,
    coalesce(octet_length(@args_needle::bytea) > 0 AND position(@args_needle::bytea IN found.args) > 0, false)::boolean AS args_matched,
    coalesce(octet_length(@metadata_needle::bytea) > 0 AND position(@metadata_needle::bytea IN found.metadata) > 0, false)::boolean AS metadata_matched,
    coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
FROM (
    SELECT
        recent.key,
        recent.state,
        recent.tenant,
        recent.run_id,
        recent.step,
        recent.business_key,
        recent.tool,
        recent.natural_id,
        recent.attempt,
        recent.created_at,
        recent.updated_at,
        recent.completed_at,
        recent.available_at,
        recent.lease_until,
        recent.last_error,
        recent.args,
        recent.metadata
    FROM /* TEMPLATE: schema */pgonce_key AS recent
    WHERE recent.created_at >= @since::timestamptz
        AND recent.created_at < coalesce(sqlc.narg('before')::timestamptz, 'infinity'::timestamptz)
        AND recent.state <> 'expired'
    UNION ALL
    SELECT
        listed.key,
        listed.state,
        listed.tenant,
        listed.run_id,
        listed.step,
        listed.business_key,
        listed.tool,
        listed.natural_id,
        listed.attempt,
        listed.created_at,
        listed.updated_at,
        listed.completed_at,
        listed.available_at,
        listed.lease_until,
        listed.last_error,
        listed.args,
        listed.metadata
    FROM /* TEMPLATE: schema */pgonce_key AS listed
    -- The list index's predicate, spelled as it is.
    WHERE listed.state NOT IN ('succeeded', 'expired')
        AND listed.created_at < @since::timestamptz
) AS found
WHERE (sqlc.narg('tenant')::text IS NULL OR coalesce(found.tenant, '') = sqlc.narg('tenant')::text)
    AND (
        (@business_key::text <> '' AND found.business_key = @business_key::text)
        OR (@natural_id::text <> '' AND found.natural_id = @natural_id::text)
        OR (@key_prefix::text <> '' AND encode(found.key, 'hex') LIKE @key_prefix::text || '%')
        OR (octet_length(@args_needle::bytea) > 0 AND position(@args_needle::bytea IN found.args) > 0)
        OR (octet_length(@metadata_needle::bytea) > 0 AND position(@metadata_needle::bytea IN found.metadata) > 0)
    )
ORDER BY
    found.created_at DESC,
    found.key DESC
LIMIT @max_rows::integer;

-- name: KeySearchByNaturalID :many
-- KeySearchByNaturalID finds the keys of a natural id, of any age, on the
-- natural id's hash index; tenant, when not NULL, keeps only its keys.
-- Newest first, up to max_rows.
SELECT
    pgonce_key.key,
    pgonce_key.state::text AS state,
    coalesce(pgonce_key.tenant, '')::text AS tenant,
    coalesce(pgonce_key.run_id, '')::text AS run_id,
    coalesce(pgonce_key.step, 0)::bigint AS step,
    coalesce(pgonce_key.business_key, '')::text AS business_key,
    coalesce(pgonce_key.tool, '')::text AS tool,
    coalesce(pgonce_key.natural_id, '')::text AS natural_id,
    pgonce_key.attempt,
    pgonce_key.created_at,
    coalesce(pgonce_key.updated_at, pgonce_key.completed_at, pgonce_key.created_at)::timestamptz AS updated_at,
    pgonce_key.completed_at,
    coalesce(pgonce_key.available_at, pgonce_key.created_at)::timestamptz AS available_at,
    pgonce_key.lease_until,
    pgonce_key.last_error,
    substring(pgonce_key.args FROM 1 FOR @args_bytes::integer)::bytea AS args_head,
    coalesce(octet_length(pgonce_key.args), 0)::integer AS args_size,
    coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
FROM /* TEMPLATE: schema */pgonce_key
WHERE pgonce_key.natural_id = @natural_id::text
    AND (sqlc.narg('tenant')::text IS NULL OR coalesce(pgonce_key.tenant, '') = sqlc.narg('tenant')::text)
ORDER BY
    pgonce_key.created_at DESC,
    pgonce_key.key DESC
LIMIT @max_rows::integer;

-- name: KeySearchRunTenants :many
-- KeySearchRunTenants returns the tenants ('' for none) that have keys of
-- run run_id created in [since, before), or older and listed, with how
-- many keys each has there: where to look for a run whose tenant an
-- operator does not know. A run's steps are then read by their scopes
-- (KeyGetByScopes), in every state and of any age.
SELECT
    coalesce(found.tenant, '')::text AS tenant,
    count(*)::bigint AS keys
FROM (
    SELECT recent.tenant
    FROM /* TEMPLATE: schema */pgonce_key AS recent
    WHERE recent.created_at >= @since::timestamptz
        AND recent.created_at < coalesce(sqlc.narg('before')::timestamptz, 'infinity'::timestamptz)
        AND recent.run_id = @run_id::text
    UNION ALL
    SELECT listed.tenant
    FROM /* TEMPLATE: schema */pgonce_key AS listed
    WHERE listed.state NOT IN ('succeeded', 'expired')
        AND listed.created_at < @since::timestamptz
        AND listed.run_id = @run_id::text
) AS found
GROUP BY 1
ORDER BY 1
LIMIT @max_rows::integer;

-- name: KeyCountCreated :many
-- KeyCountCreated counts the keys created in [since, before) per tool and
-- state (pending and in_flight for open keys; tombstones under the empty
-- tool), reading at most max_rows of them: a count that reached max_rows in
-- total is a lower bound, which the caller reports.
SELECT
    coalesce(windowed.tool, '')::text AS tool,
    (CASE
        WHEN windowed.state = 'open' AND windowed.lease_until IS NOT NULL THEN 'in_flight'
        WHEN windowed.state = 'open' THEN 'pending'
        ELSE windowed.state::text
    END)::text AS state,
    count(*)::bigint AS keys
FROM (
    SELECT
        pgonce_key.tool,
        pgonce_key.state,
        pgonce_key.lease_until
    FROM /* TEMPLATE: schema */pgonce_key
    WHERE pgonce_key.created_at >= @since::timestamptz
        AND pgonce_key.created_at < coalesce(sqlc.narg('before')::timestamptz, 'infinity'::timestamptz)
    LIMIT @max_rows::integer
) AS windowed
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: KeyListWindow :many
-- KeyListWindow pages through the keys created in [since, before) in the
-- given states (a comma-separated list of stored states, succeeded and
-- expired included) in creation order, (created_at, key), from the cursor
-- on: the list of succeeded keys and tombstones, which pgonce_key_list_idx
-- leaves out. It reads the window through the BRIN index on created_at:
-- each page reads the window's keys from the cursor on. The filters are
-- KeyList's.
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
    substring(pgonce_key.args FROM 1 FOR @args_bytes::integer)::bytea AS args_head,
    coalesce(octet_length(pgonce_key.args), 0)::integer AS args_size,
    coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
FROM /* TEMPLATE: schema */pgonce_key
WHERE pgonce_key.created_at >= @since::timestamptz
    AND pgonce_key.created_at < @before::timestamptz
    AND (pgonce_key.created_at, pgonce_key.key) > (@after_created_at::timestamptz, @after_key::bytea)
    AND (
        (pgonce_key.state::text = ANY(string_to_array(@states::text, ',')) AND pgonce_key.state <> 'open')
        OR (pgonce_key.state = 'open' AND @pending::boolean AND pgonce_key.lease_until IS NULL)
        OR (pgonce_key.state = 'open' AND @in_flight::boolean AND pgonce_key.lease_until IS NOT NULL)
    )
    AND (sqlc.narg('tool')::text IS NULL OR pgonce_key.tool = sqlc.narg('tool')::text)
    AND (sqlc.narg('tenant')::text IS NULL OR pgonce_key.tenant = sqlc.narg('tenant')::text)
    AND (sqlc.narg('run_id')::text IS NULL OR pgonce_key.run_id = sqlc.narg('run_id')::text)
ORDER BY
    pgonce_key.created_at,
    pgonce_key.key
LIMIT @max_rows::integer;
