-- +goose Up

-- pgonce_resolution records every operator decision on a key: a
-- needs-review key's resolution, a cancellation, a retry; what was decided,
-- by whom, why and when. Retention deletes a key's
-- decisions in the statement that turns the key into a tombstone, which
-- keeps only what a late duplicate needs. key is not a foreign key: a key's
-- uniqueness is its scope's (see pgonce_key).
CREATE TABLE /* TEMPLATE: schema */pgonce_resolution (
    id bigserial PRIMARY KEY,
    resolved_at timestamptz NOT NULL DEFAULT now(),
    key bytea NOT NULL,
    action text NOT NULL,
    resolved_by text NOT NULL,
    reason text NOT NULL,
    CONSTRAINT pgonce_resolution_key_check CHECK (octet_length(key) = 32),
    CONSTRAINT pgonce_resolution_action_check CHECK (action IN ('succeeded', 'failed', 'retry', 'cancel'))
);

CREATE INDEX pgonce_resolution_key_idx ON /* TEMPLATE: schema */pgonce_resolution (key, resolved_at);

-- +goose Down
DROP TABLE /* TEMPLATE: schema */pgonce_resolution;
