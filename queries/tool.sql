-- Flow control of tools: limits, pauses and slow-downs, over pgonce_tool,
-- and the claim of the keys of tools that have them.

-- name: ToolList :many
-- ToolList reads the flow control of every tool that has any, by name.
SELECT
    pgonce_tool.tool,
    pgonce_tool.max_in_flight,
    pgonce_tool.rate,
    pgonce_tool.burst,
    pgonce_tool.not_before,
    pgonce_tool.paused_at,
    pgonce_tool.paused_by,
    pgonce_tool.paused_reason,
    pgonce_tool.updated_at,
    -- open_keys: whether a key of the tool is pending or in flight, read
    -- through the due and in-flight indexes (an operator who paused a
    -- misspelt name is told that no call uses it).
    (EXISTS (
        SELECT 1
        FROM /* TEMPLATE: schema */pgonce_key
        WHERE pgonce_key.tool = pgonce_tool.tool
            AND pgonce_key.state = 'open'
            AND pgonce_key.lease_until IS NULL
    ) OR EXISTS (
        SELECT 1
        FROM /* TEMPLATE: schema */pgonce_key
        WHERE pgonce_key.tool = pgonce_tool.tool
            AND pgonce_key.lease_until IS NOT NULL
    ))::boolean AS open_keys,
    coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
FROM /* TEMPLATE: schema */pgonce_tool
ORDER BY pgonce_tool.tool;

-- name: ToolOpenKeys :one
-- ToolOpenKeys reports whether a key of the tool is pending or in
-- flight, as ToolList's open_keys does, for a tool without a row.
SELECT (EXISTS (
    SELECT 1
    FROM /* TEMPLATE: schema */pgonce_key
    WHERE pgonce_key.tool = @tool::text
        AND pgonce_key.state = 'open'
        AND pgonce_key.lease_until IS NULL
) OR EXISTS (
    SELECT 1
    FROM /* TEMPLATE: schema */pgonce_key
    WHERE pgonce_key.tool = @tool::text
        AND pgonce_key.lease_until IS NOT NULL
))::boolean AS open_keys;

-- name: ToolPause :one
-- ToolPause pauses a tool, and records who did it and why. Pausing a paused
-- tool changes nothing and records nothing (changed is 0): the first pause
-- keeps its reason. Dispatchers are told on the work channel, with the
-- payload tool:<name>, so that they read the tool's control again.
WITH paused AS (
    INSERT INTO /* TEMPLATE: schema */pgonce_tool AS control (
        tool,
        paused_at,
        paused_by,
        paused_reason,
        updated_at
    )
    VALUES (
        @tool::text,
        coalesce(sqlc.narg('now')::timestamptz, now()),
        @acted_by::text,
        @reason::text,
        coalesce(sqlc.narg('now')::timestamptz, now())
    )
    ON CONFLICT (tool) DO UPDATE
    SET
        paused_at = excluded.paused_at,
        paused_by = excluded.paused_by,
        paused_reason = excluded.paused_reason,
        updated_at = excluded.updated_at
    WHERE control.paused_at IS NULL
    RETURNING control.tool
),
recorded AS (
    INSERT INTO /* TEMPLATE: schema */pgonce_tool_action (
        acted_at,
        tool,
        action,
        acted_by,
        reason
    )
    SELECT
        coalesce(sqlc.narg('now')::timestamptz, now()),
        paused.tool,
        'pause',
        @acted_by::text,
        @reason::text
    FROM paused
    RETURNING pgonce_tool_action.id
),
notified AS (
    SELECT pg_notify(@channel::text, 'tool:' || paused.tool)
    FROM paused
    WHERE @channel::text <> ''
)
SELECT
    (SELECT count(*) FROM paused)::bigint AS changed,
    (SELECT count(*) FROM recorded)::bigint AS recorded,
    (SELECT count(*) FROM notified)::bigint AS notified;

-- name: ToolResume :one
-- ToolResume ends a tool's pause, and records who did it and why. A tool
-- left with no limit and no slow-down loses its row, so that its keys are
-- claimed by the plain claim again. Resuming a tool that is not paused
-- changes nothing and records nothing (changed is 0).
WITH dropped AS (
    DELETE FROM /* TEMPLATE: schema */pgonce_tool
    WHERE pgonce_tool.tool = @tool::text
        AND pgonce_tool.paused_at IS NOT NULL
        AND pgonce_tool.max_in_flight IS NULL
        AND pgonce_tool.rate IS NULL
        AND coalesce(pgonce_tool.not_before <= coalesce(sqlc.narg('now')::timestamptz, now()), true)
    RETURNING pgonce_tool.tool
),
kept AS (
    UPDATE /* TEMPLATE: schema */pgonce_tool
    SET
        paused_at = NULL,
        paused_by = NULL,
        paused_reason = NULL,
        updated_at = coalesce(sqlc.narg('now')::timestamptz, now())
    WHERE pgonce_tool.tool = @tool::text
        AND pgonce_tool.paused_at IS NOT NULL
        AND NOT (pgonce_tool.max_in_flight IS NULL
            AND pgonce_tool.rate IS NULL
            AND coalesce(pgonce_tool.not_before <= coalesce(sqlc.narg('now')::timestamptz, now()), true))
    RETURNING pgonce_tool.tool
),
resumed AS (
    SELECT dropped.tool FROM dropped
    UNION ALL
    SELECT kept.tool FROM kept
),
recorded AS (
    INSERT INTO /* TEMPLATE: schema */pgonce_tool_action (
        acted_at,
        tool,
        action,
        acted_by,
        reason
    )
    SELECT
        coalesce(sqlc.narg('now')::timestamptz, now()),
        resumed.tool,
        'resume',
        @acted_by::text,
        @reason::text
    FROM resumed
    RETURNING pgonce_tool_action.id
),
notified AS (
    SELECT pg_notify(@channel::text, 'tool:' || resumed.tool)
    FROM resumed
    WHERE @channel::text <> ''
)
SELECT
    (SELECT count(*) FROM resumed)::bigint AS changed,
    (SELECT count(*) FROM recorded)::bigint AS recorded,
    (SELECT count(*) FROM notified)::bigint AS notified;

-- name: ToolSetLimits :one
-- ToolSetLimits sets a tool's limits, and records who did it and why. A
-- NULL limit is no limit of that kind; a tool left with no limit, no pause
-- and no slow-down loses its row. A new or changed rate starts with a full
-- bucket of burst claims.
WITH current AS (
    SELECT
        pgonce_tool.tool,
        pgonce_tool.paused_at,
        pgonce_tool.not_before,
        pgonce_tool.rate,
        pgonce_tool.burst
    FROM /* TEMPLATE: schema */pgonce_tool
    WHERE pgonce_tool.tool = @tool::text
    FOR UPDATE
),
dropped AS (
    DELETE FROM /* TEMPLATE: schema */pgonce_tool
    USING current
    WHERE pgonce_tool.tool = current.tool
        AND sqlc.narg('max_in_flight')::integer IS NULL
        AND sqlc.narg('rate')::double precision IS NULL
        AND current.paused_at IS NULL
        AND coalesce(current.not_before <= coalesce(sqlc.narg('now')::timestamptz, now()), true)
    RETURNING pgonce_tool.tool
),
upserted AS (
    INSERT INTO /* TEMPLATE: schema */pgonce_tool AS control (
        tool,
        max_in_flight,
        rate,
        burst,
        tokens,
        refilled_at,
        updated_at
    )
    SELECT
        @tool::text,
        sqlc.narg('max_in_flight')::integer,
        sqlc.narg('rate')::double precision,
        sqlc.narg('burst')::integer,
        sqlc.narg('burst')::integer,
        CASE WHEN sqlc.narg('rate')::double precision IS NOT NULL THEN coalesce(sqlc.narg('now')::timestamptz, clock_timestamp()) END,
        coalesce(sqlc.narg('now')::timestamptz, now())
    WHERE NOT EXISTS (SELECT 1 FROM dropped)
        AND (sqlc.narg('max_in_flight')::integer IS NOT NULL
            OR sqlc.narg('rate')::double precision IS NOT NULL
            OR EXISTS (SELECT 1 FROM current))
    ON CONFLICT (tool) DO UPDATE
    SET
        max_in_flight = excluded.max_in_flight,
        rate = excluded.rate,
        burst = excluded.burst,
        -- An unchanged rate keeps its bucket; a changed one starts full.
        tokens = CASE
            WHEN control.rate IS NOT DISTINCT FROM excluded.rate AND control.burst IS NOT DISTINCT FROM excluded.burst THEN control.tokens
            ELSE excluded.tokens
        END,
        refilled_at = CASE
            WHEN control.rate IS NOT DISTINCT FROM excluded.rate AND control.burst IS NOT DISTINCT FROM excluded.burst THEN control.refilled_at
            ELSE excluded.refilled_at
        END,
        updated_at = excluded.updated_at
    RETURNING control.tool
),
acted AS (
    SELECT dropped.tool FROM dropped
    UNION ALL
    SELECT upserted.tool FROM upserted
),
recorded AS (
    INSERT INTO /* TEMPLATE: schema */pgonce_tool_action (
        acted_at,
        tool,
        action,
        acted_by,
        reason
    )
    SELECT
        coalesce(sqlc.narg('now')::timestamptz, now()),
        acted.tool,
        'limit',
        @acted_by::text,
        @reason::text
    FROM acted
    RETURNING pgonce_tool_action.id
),
notified AS (
    SELECT pg_notify(@channel::text, 'tool:' || acted.tool)
    FROM acted
    WHERE @channel::text <> ''
)
SELECT
    (SELECT count(*) FROM acted)::bigint AS changed,
    (SELECT count(*) FROM recorded)::bigint AS recorded,
    (SELECT count(*) FROM notified)::bigint AS notified;

-- name: ToolActionList :many
-- ToolActionList reads the operator decisions on a tool, newest first.
SELECT
    pgonce_tool_action.acted_at,
    pgonce_tool_action.action,
    pgonce_tool_action.acted_by,
    pgonce_tool_action.reason
FROM /* TEMPLATE: schema */pgonce_tool_action
WHERE pgonce_tool_action.tool = @tool::text
ORDER BY pgonce_tool_action.acted_at DESC, pgonce_tool_action.id DESC
LIMIT @max_rows::integer;

-- name: ToolThrottle :one
-- ToolThrottle slows a tool down after its provider asked to (a 429 with
-- Retry-After, say): no key of the tool is claimed before not_before, by
-- any dispatcher; a later not_before already set is kept. When key is
-- given, the attempt that was told to slow down goes back to pending, due
-- at not_before, without spending the attempt: its attempt number moves
-- back, fenced like OutboxRelease, and no pgonce_attempt row is written
-- for it. A tool that had no row is new to the dispatchers, which claim
-- its keys with the plain claim until the notification reaches them: its
-- pending keys due sooner are made due at not_before in this statement, so
-- that none is claimed early meanwhile.
WITH throttled AS (
    INSERT INTO /* TEMPLATE: schema */pgonce_tool AS control (
        tool,
        not_before,
        updated_at
    )
    VALUES (
        @tool::text,
        coalesce(sqlc.narg('now')::timestamptz, clock_timestamp()) + sqlc.arg('delay_ms')::bigint * interval '1 millisecond',
        coalesce(sqlc.narg('now')::timestamptz, now())
    )
    ON CONFLICT (tool) DO UPDATE
    SET
        not_before = greatest(control.not_before, excluded.not_before),
        updated_at = excluded.updated_at
    RETURNING
        control.tool,
        control.not_before,
        (control.xmax = 0) AS inserted
),
released AS (
    UPDATE /* TEMPLATE: schema */pgonce_key
    SET
        attempt = pgonce_key.attempt - 1,
        lease_until = NULL,
        worker = NULL,
        available_at = throttled.not_before,
        ambiguous = @ambiguous::boolean,
        last_error = @last_error::text,
        updated_at = coalesce(sqlc.narg('now')::timestamptz, now())
    FROM throttled
    WHERE pgonce_key.key = sqlc.narg('key')::bytea
        AND pgonce_key.tool = throttled.tool
        AND pgonce_key.attempt = CASE
            WHEN pgonce_key.state = 'open' AND pgonce_key.lease_until IS NOT NULL THEN @attempt::integer
        END
    RETURNING pgonce_key.key
),
pushed AS (
    UPDATE /* TEMPLATE: schema */pgonce_key
    SET available_at = throttled.not_before
    FROM throttled
    WHERE throttled.inserted
        AND pgonce_key.tool = throttled.tool
        AND pgonce_key.state = 'open'
        AND pgonce_key.lease_until IS NULL
        AND pgonce_key.available_at < throttled.not_before
    RETURNING pgonce_key.key
),
notified AS (
    SELECT pg_notify(@channel::text, 'tool:' || throttled.tool)
    FROM throttled
    WHERE @channel::text <> ''
        AND throttled.inserted
)
SELECT
    throttled.not_before::timestamptz AS not_before,
    throttled.inserted::boolean AS inserted,
    (SELECT count(*) FROM released)::bigint AS released,
    (SELECT count(*) FROM pushed)::bigint AS pushed,
    (SELECT count(*) FROM notified)::bigint AS notified
FROM throttled;

-- name: ToolLock :many
-- ToolLock locks the control rows of the given tools, in name order so that
-- claims of overlapping tools never deadlock, in the transaction of a
-- controlled claim (OutboxClaimControlled, the next statement): claims of a
-- tool take their budget one after the other, and each reads what the one
-- before it claimed, since its statement starts after the lock is granted.
-- It returns the rows as locked, the clock the budgets are taken at.
SELECT
    pgonce_tool.tool,
    pgonce_tool.max_in_flight,
    pgonce_tool.rate,
    pgonce_tool.burst,
    pgonce_tool.tokens,
    pgonce_tool.refilled_at,
    pgonce_tool.not_before,
    (pgonce_tool.paused_at IS NOT NULL)::boolean AS paused,
    -- waiting: whether a key of the tool is due, read before the lock was
    -- granted; it tells the claimer whether to come back soon.
    EXISTS (
        SELECT 1
        FROM /* TEMPLATE: schema */pgonce_key
        WHERE pgonce_key.tool = pgonce_tool.tool
            AND pgonce_key.state = 'open'
            AND pgonce_key.lease_until IS NULL
            AND pgonce_key.available_at <= coalesce(sqlc.narg('now')::timestamptz, now())
    )::boolean AS waiting,
    coalesce(sqlc.narg('now')::timestamptz, clock_timestamp())::timestamptz AS now
FROM /* TEMPLATE: schema */pgonce_tool
WHERE pgonce_tool.tool = any(@tools::text[])
ORDER BY pgonce_tool.tool
FOR UPDATE;

-- name: ToolForget :many
-- ToolForget deletes the control rows of the given tools that control
-- nothing any more: no limit, no pause, and a not_before that has passed
-- (a slow-down that ended). Their keys return to the plain claim, which
-- never reads pgonce_tool. It runs in the transaction of a controlled claim
-- after ToolLock, which holds the rows: a slow-down that a provider asks
-- for meanwhile waits for the lock and then inserts a new row.
DELETE FROM /* TEMPLATE: schema */pgonce_tool
WHERE pgonce_tool.tool = any(@tools::text[])
    AND pgonce_tool.max_in_flight IS NULL
    AND pgonce_tool.rate IS NULL
    AND pgonce_tool.paused_at IS NULL
    AND coalesce(pgonce_tool.not_before <= coalesce(sqlc.narg('now')::timestamptz, clock_timestamp()), true)
RETURNING pgonce_tool.tool;

-- name: OutboxClaimControlled :many
-- OutboxClaimControlled claims due pending keys of tools that have flow
-- control, as OutboxClaimBatch does, but never more of a tool's keys than
-- its free budget: none while the tool is paused or slowed down (before its
-- not_before), no more than its max_in_flight less the keys of the tool
-- already in flight (counted through the in-flight index, which holds only
-- the keys in flight, by tool: the planner reads only the tool's entries
-- even on a table it has no statistics for), and no more than the whole tokens of its rate's bucket,
-- which the claim spends. It runs in the transaction that locked the tools'
-- rows (ToolLock) and after it, so that the count and the tokens are those
-- the previous claim of the tool left. The bucket's clock is the wall
-- clock (clock_timestamp), not the transaction's start: a claim that
-- waited for the lock must not refill from a time before the claim it
-- waited for. It is read once (clock), and the bucket is refilled up to
-- that instant and no further: the tokens that accrue while the claim
-- runs are the next claim's, not lost.
WITH clock AS (
    SELECT coalesce(sqlc.narg('now')::timestamptz, clock_timestamp()) AS at
),
bucket AS (
    SELECT
        pgonce_tool.tool,
        pgonce_tool.rate,
        pgonce_tool.max_in_flight,
        pgonce_tool.paused_at,
        pgonce_tool.not_before,
        clock.at,
        least(
            pgonce_tool.burst::double precision,
            pgonce_tool.tokens + pgonce_tool.rate * greatest(0, extract(epoch FROM clock.at - pgonce_tool.refilled_at))::double precision
        ) AS tokens
    FROM /* TEMPLATE: schema */pgonce_tool
    CROSS JOIN clock
    WHERE pgonce_tool.tool = any(@tools::text[])
),
control AS (
    SELECT
        bucket.tool,
        bucket.rate,
        bucket.at,
        bucket.tokens,
        greatest(0, CASE
            WHEN bucket.paused_at IS NOT NULL THEN 0
            WHEN bucket.not_before > bucket.at THEN 0
            ELSE least(
                @max_rows::integer,
                bucket.max_in_flight - (
                    SELECT count(*)
                    FROM /* TEMPLATE: schema */pgonce_key
                    WHERE pgonce_key.lease_until IS NOT NULL
                        AND pgonce_key.tool = bucket.tool
                )::integer,
                floor(bucket.tokens)::integer
            )
        END) AS budget
    FROM bucket
),
due AS (
    SELECT candidate.scope
    FROM control
    CROSS JOIN LATERAL (
        SELECT
            pgonce_key.scope,
            pgonce_key.available_at
        FROM /* TEMPLATE: schema */pgonce_key
        WHERE pgonce_key.tool = control.tool
            AND pgonce_key.state = 'open'
            AND pgonce_key.lease_until IS NULL
            AND pgonce_key.available_at <= coalesce(sqlc.narg('now')::timestamptz, now())
        ORDER BY pgonce_key.available_at
        LIMIT control.budget
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
),
spent AS (
    UPDATE /* TEMPLATE: schema */pgonce_tool
    SET
        tokens = control.tokens - (SELECT count(*) FROM claimed WHERE claimed.tool = control.tool),
        refilled_at = control.at
    FROM control
    WHERE pgonce_tool.tool = control.tool
        AND control.rate IS NOT NULL
    RETURNING pgonce_tool.tool
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
    claimed.available_at::timestamptz AS available_at,
    coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now,
    (CASE
        WHEN claimed.tool = ANY(@replicated_tools::text[])
            THEN set_config('synchronous_commit', 'remote_apply', true) = 'remote_apply'
        ELSE false
    END)::boolean AS replicated,
    (SELECT count(*) FROM spent)::bigint AS spent
FROM claimed
ORDER BY claimed.key;

-- name: ToolEndSlowDown :one
-- ToolEndSlowDown ends a tool's slow-down before its not_before, and
-- records who did it and why: an operator's override of what a provider
-- asked for. The tool's pending keys due before not_before, which the
-- slow-down held (ToolThrottle made them due at its not_before), are due
-- at once. A tool left with no limit and no pause loses its row, so that
-- its keys are claimed by the plain claim again. A tool that is not slowed
-- down changes nothing and records nothing (changed is 0).
WITH slowed AS (
    SELECT
        pgonce_tool.tool,
        pgonce_tool.not_before
    FROM /* TEMPLATE: schema */pgonce_tool
    WHERE pgonce_tool.tool = @tool::text
        AND pgonce_tool.not_before > coalesce(sqlc.narg('now')::timestamptz, now())
    FOR UPDATE
),
dropped AS (
    DELETE FROM /* TEMPLATE: schema */pgonce_tool
    USING slowed
    WHERE pgonce_tool.tool = slowed.tool
        AND pgonce_tool.max_in_flight IS NULL
        AND pgonce_tool.rate IS NULL
        AND pgonce_tool.paused_at IS NULL
    RETURNING pgonce_tool.tool
),
kept AS (
    UPDATE /* TEMPLATE: schema */pgonce_tool
    SET
        not_before = NULL,
        updated_at = coalesce(sqlc.narg('now')::timestamptz, now())
    FROM slowed
    WHERE pgonce_tool.tool = slowed.tool
        AND NOT (pgonce_tool.max_in_flight IS NULL
            AND pgonce_tool.rate IS NULL
            AND pgonce_tool.paused_at IS NULL)
    RETURNING pgonce_tool.tool
),
ended AS (
    SELECT dropped.tool FROM dropped
    UNION ALL
    SELECT kept.tool FROM kept
),
due AS (
    UPDATE /* TEMPLATE: schema */pgonce_key
    SET available_at = coalesce(sqlc.narg('now')::timestamptz, now())
    FROM slowed
    WHERE pgonce_key.tool = slowed.tool
        AND pgonce_key.state = 'open'
        AND pgonce_key.lease_until IS NULL
        AND pgonce_key.available_at > coalesce(sqlc.narg('now')::timestamptz, now())
        AND pgonce_key.available_at <= slowed.not_before
    RETURNING pgonce_key.key
),
recorded AS (
    INSERT INTO /* TEMPLATE: schema */pgonce_tool_action (
        acted_at,
        tool,
        action,
        acted_by,
        reason
    )
    SELECT
        coalesce(sqlc.narg('now')::timestamptz, now()),
        ended.tool,
        'end_slow_down',
        @acted_by::text,
        @reason::text
    FROM ended
    RETURNING pgonce_tool_action.id
),
notified AS (
    SELECT pg_notify(@channel::text, 'tool:' || ended.tool)
    FROM ended
    WHERE @channel::text <> ''
)
SELECT
    (SELECT count(*) FROM ended)::bigint AS changed,
    (SELECT count(*) FROM recorded)::bigint AS recorded,
    (SELECT count(*) FROM due)::bigint AS due,
    (SELECT count(*) FROM notified)::bigint AS notified;
