-- +goose Up

-- A tool's flow control is for names a call can have: the rule of
-- outbox.Call.Tool, which the client now applies before it writes here.
-- Rows of other names, which earlier versions accepted, control nothing (no
-- key can have such a tool) and are deleted; their decisions stay in
-- pgonce_tool_action.
DELETE FROM /* TEMPLATE: schema */pgonce_tool
WHERE NOT (tool ~ '^[a-z][a-z0-9_.:-]{0,63}$');

ALTER TABLE /* TEMPLATE: schema */pgonce_tool
    DROP CONSTRAINT pgonce_tool_name_check,
    ADD CONSTRAINT pgonce_tool_name_check CHECK (tool ~ '^[a-z][a-z0-9_.:-]{0,63}$');

-- end_slow_down: an operator ended a provider's slow-down early
-- (outbox.Client.EndSlowDown).
ALTER TABLE /* TEMPLATE: schema */pgonce_tool_action
    DROP CONSTRAINT pgonce_tool_action_action_check,
    ADD CONSTRAINT pgonce_tool_action_action_check CHECK (action IN ('pause', 'resume', 'limit', 'end_slow_down'));

-- +goose Down

-- The decisions of 00005's vocabulary only: an ended slow-down is
-- recorded as the resume it was.
UPDATE /* TEMPLATE: schema */pgonce_tool_action
SET action = 'resume'
WHERE action = 'end_slow_down';

ALTER TABLE /* TEMPLATE: schema */pgonce_tool_action
    DROP CONSTRAINT pgonce_tool_action_action_check,
    ADD CONSTRAINT pgonce_tool_action_action_check CHECK (action IN ('pause', 'resume', 'limit'));

ALTER TABLE /* TEMPLATE: schema */pgonce_tool
    DROP CONSTRAINT pgonce_tool_name_check,
    ADD CONSTRAINT pgonce_tool_name_check CHECK (octet_length(tool) BETWEEN 1 AND 2000);
