-- +goose Up

-- pgonce_leader holds one leadership per name, for the dispatchers that
-- elect one among themselves to run maintenance (reconciling and retention
-- pruning; see dispatcher.Config.MaintenanceDisabled). A leadership is a
-- row with a lease, not a session advisory lock, so that it survives
-- transaction-pooling proxies such as PgBouncer, where a session lock
-- belongs to whichever client borrowed the server connection. A leader
-- renews its lease while it runs and deletes its row when it stops; a
-- crashed leader's lease expires and another takes over.
CREATE TABLE /* TEMPLATE: schema */pgonce_leader (
    name text PRIMARY KEY,
    leader_id text NOT NULL,
    elected_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    CONSTRAINT pgonce_leader_name_check CHECK (octet_length(name) BETWEEN 1 AND 200),
    CONSTRAINT pgonce_leader_leader_id_check CHECK (octet_length(leader_id) BETWEEN 1 AND 256),
    CONSTRAINT pgonce_leader_expires_check CHECK (expires_at > elected_at)
);

-- +goose Down
DROP TABLE /* TEMPLATE: schema */pgonce_leader;
