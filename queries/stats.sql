-- name: StatsKeyTable :one
-- StatsKeyTable reads what the planner knows about the key table, writing
-- nothing and reading no row of it: its size now, and the rows it will have
-- at that size, scaled from the last VACUUM or ANALYZE as the planner
-- scales them (-1 before the table was first analyzed or vacuumed), and,
-- from pg_stats, how the tool column is spread: tombstones, and only they,
-- keep no tool, so the tool's null fraction is the share of tombstones.
WITH key_table AS (
    SELECT
        pg_class.oid,
        pg_class.relname,
        pg_class.relpages,
        pg_class.reltuples,
        pg_namespace.nspname
    FROM pg_catalog.pg_class
    JOIN pg_catalog.pg_namespace ON pg_namespace.oid = pg_class.relnamespace
    -- The marker in the literal names the client's table.
    WHERE pg_class.oid = '/* TEMPLATE: schema */pgonce_key'::regclass
)
SELECT
    (pg_relation_size(key_table.oid) / current_setting('block_size')::bigint)::bigint AS pages,
    (CASE
        WHEN key_table.reltuples < 0 THEN -1
        WHEN key_table.relpages = 0 THEN key_table.reltuples
        ELSE key_table.reltuples / key_table.relpages
            * (pg_relation_size(key_table.oid) / current_setting('block_size')::float8)
    END)::float8 AS estimated_rows,
    coalesce((
        SELECT pg_stats.null_frac
        FROM pg_catalog.pg_stats
        WHERE (pg_stats.schemaname, pg_stats.tablename) = (key_table.nspname, key_table.relname)
            AND pg_stats.attname = 'tool'
            AND NOT pg_stats.inherited
    ), 0)::float8 AS tool_null_fraction,
    coalesce((
        SELECT pg_stats.n_distinct
        FROM pg_catalog.pg_stats
        WHERE (pg_stats.schemaname, pg_stats.tablename) = (key_table.nspname, key_table.relname)
            AND pg_stats.attname = 'tool'
            AND NOT pg_stats.inherited
    ), 0)::float8 AS tool_distinct,
    EXISTS (
        SELECT 1
        FROM pg_catalog.pg_stats
        WHERE (pg_stats.schemaname, pg_stats.tablename) = (key_table.nspname, key_table.relname)
            AND NOT pg_stats.inherited
    )::boolean AS analyzed
FROM key_table;

-- name: StatsToolFractions :many
-- StatsToolFractions returns the most common tools of the key table and the
-- fraction of its rows each holds, from pg_stats (nothing when the table
-- was never analyzed).
SELECT
    (pg_stats.most_common_vals::text::text[])[tool_mcv.i]::text AS tool,
    (pg_stats.most_common_freqs::float4[])[tool_mcv.i]::float8 AS fraction
FROM pg_catalog.pg_stats
JOIN pg_catalog.pg_class AS key_class
    ON key_class.oid = '/* TEMPLATE: schema */pgonce_key'::regclass
JOIN pg_catalog.pg_namespace AS key_namespace
    ON key_namespace.oid = key_class.relnamespace
CROSS JOIN LATERAL generate_series(1, cardinality(pg_stats.most_common_freqs::float4[])) AS tool_mcv (i)
WHERE (pg_stats.schemaname, pg_stats.tablename) = (key_namespace.nspname, key_class.relname)
    AND pg_stats.attname = 'tool'
    AND NOT pg_stats.inherited
ORDER BY 1;

-- name: StatsKeyCountListed :many
-- StatsKeyCountListed counts exactly, per tool, the keys in the states that
-- pgonce_key_list_idx covers (pending and in flight, failed, needs review,
-- cancelled): it reads that partial index and the rows it points to, never
-- the succeeded keys and tombstones that make up nearly all of a large
-- table. Its predicate is spelled as the index's, so that the planner can
-- use the partial index.
SELECT
    coalesce(pgonce_key.tool, '')::text AS tool,
    (CASE
        WHEN pgonce_key.state = 'open' AND pgonce_key.lease_until IS NOT NULL THEN 'in_flight'
        WHEN pgonce_key.state = 'open' THEN 'pending'
        ELSE pgonce_key.state::text
    END)::text AS state,
    count(*)::bigint AS keys
FROM /* TEMPLATE: schema */pgonce_key
WHERE pgonce_key.state NOT IN ('succeeded', 'expired')
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: StatsOldestPendingByTool :many
-- StatsOldestPendingByTool reads, for each of tools, the head of
-- pgonce_key_due_idx: how long the tool's oldest due pending key has waited,
-- 0 when none of its pending keys is due.
SELECT
    wanted.tool::text AS tool,
    coalesce(
        extract(epoch FROM coalesce(sqlc.narg('now')::timestamptz, now()) - head.available_at) * 1000,
        0
    )::bigint AS oldest_pending_ms
FROM unnest(@tools::text[]) AS wanted (tool)
LEFT JOIN LATERAL (
    SELECT pgonce_key.available_at
    FROM /* TEMPLATE: schema */pgonce_key
    WHERE pgonce_key.state = 'open'
        AND pgonce_key.lease_until IS NULL
        AND pgonce_key.tool = wanted.tool
        AND pgonce_key.available_at <= coalesce(sqlc.narg('now')::timestamptz, now())
    ORDER BY pgonce_key.available_at
    LIMIT 1
) AS head ON true
ORDER BY 1;
