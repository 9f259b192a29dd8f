-- +goose Up

-- pgonce_tool holds the flow control of a tool, shared by every dispatcher
-- of the schema: limits an operator set, a pause, and the not-before time a
-- provider's "slow down" (a 429 with Retry-After, say) asked for. A tool
-- without a row has no flow control, and its keys are claimed by the plain
-- claim statement, which never reads this table. A claim of a tool with a
-- row locks it first (FOR UPDATE), so that claims of one tool take their
-- budget one after the other across all dispatchers.
CREATE TABLE /* TEMPLATE: schema */pgonce_tool (
    tool text PRIMARY KEY,
    -- max_in_flight is the most keys of the tool held in flight at once,
    -- across all dispatchers; NULL for no limit.
    max_in_flight integer,
    -- rate is the most claims per second, with up to burst at once; NULL
    -- for no rate limit. tokens and refilled_at are the token bucket: how
    -- many claims could be taken at refilled_at.
    rate double precision,
    burst integer,
    tokens double precision,
    refilled_at timestamptz,
    -- not_before is when the tool may be called again after a provider
    -- asked to slow down; no key of the tool is claimed before it.
    not_before timestamptz,
    -- paused_at, paused_by and paused_reason are set together while an
    -- operator paused the tool: its keys wait, and submits still add to them.
    paused_at timestamptz,
    paused_by text,
    paused_reason text,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT pgonce_tool_name_check CHECK (octet_length(tool) BETWEEN 1 AND 2000),
    CONSTRAINT pgonce_tool_max_in_flight_check CHECK (max_in_flight IS NULL OR max_in_flight >= 1),
    CONSTRAINT pgonce_tool_rate_check CHECK (
        (rate IS NULL) = (burst IS NULL)
        AND (rate IS NULL) = (refilled_at IS NULL)
        AND (rate IS NULL) = (tokens IS NULL)
        AND (rate IS NULL OR (rate > 0 AND burst >= 1))
    ),
    CONSTRAINT pgonce_tool_paused_check CHECK (
        (paused_at IS NULL) = (paused_by IS NULL) AND (paused_at IS NULL) = (paused_reason IS NULL)
    )
);

-- pgonce_tool_action records every operator decision on a tool: a pause, a
-- resume, limits set or cleared; by whom, why and when.
CREATE TABLE /* TEMPLATE: schema */pgonce_tool_action (
    id bigserial PRIMARY KEY,
    acted_at timestamptz NOT NULL DEFAULT now(),
    tool text NOT NULL,
    action text NOT NULL,
    acted_by text NOT NULL,
    reason text NOT NULL,
    CONSTRAINT pgonce_tool_action_action_check CHECK (action IN ('pause', 'resume', 'limit'))
);

CREATE INDEX pgonce_tool_action_tool_idx ON /* TEMPLATE: schema */pgonce_tool_action (tool, acted_at);

-- +goose Down
DROP TABLE /* TEMPLATE: schema */pgonce_tool_action;
DROP TABLE /* TEMPLATE: schema */pgonce_tool;
