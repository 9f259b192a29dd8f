-- +goose Up

-- pgonce_resolution records every operator decision on a needs-review key:
-- what was decided, by whom, why and when. It goes with its key when
-- retention prunes the key.
CREATE TABLE /* TEMPLATE: schema */pgonce_resolution (
    id bigserial PRIMARY KEY,
    key text NOT NULL REFERENCES /* TEMPLATE: schema */pgonce_key (key) ON DELETE CASCADE,
    action text NOT NULL,
    resolved_by text NOT NULL,
    reason text NOT NULL,
    resolved_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT pgonce_resolution_action_check CHECK (action IN ('succeeded', 'failed', 'retry'))
);

CREATE INDEX pgonce_resolution_key_idx ON /* TEMPLATE: schema */pgonce_resolution (key, resolved_at);

-- +goose Down
DROP TABLE /* TEMPLATE: schema */pgonce_resolution;
