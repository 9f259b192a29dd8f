-- +goose Up

-- The claim of a tool with a max_in_flight (OutboxClaimControlled) counts
-- the tool's keys in flight. The lease index holds those keys, but by lease
-- end, not by tool: on a table without statistics (one filled since
-- autovacuum last analyzed it) the planner took lease_until IS NOT NULL for
-- 99.5 % of the rows and counted by reading the whole table, at every
-- claim. This index holds the keys in flight by tool, so that the count
-- reads only the tool's entries whatever the statistics. It holds only the
-- keys in flight: a few pages, however large the table.
CREATE INDEX pgonce_key_in_flight_idx ON /* TEMPLATE: schema */pgonce_key (tool) WHERE lease_until IS NOT NULL;

-- +goose Down
DROP INDEX /* TEMPLATE: schema */pgonce_key_in_flight_idx;
