-- +goose Up

-- The key becomes pgonce_key's primary key, a unique B-tree, in place of
-- 00001's hash index on it. A key fixes its scope, so the unique scope
-- already made every key unique, but the planner could not see it: with no
-- statistics on the table (a table filled since autovacuum last analyzed
-- it) it estimated a match on one key at 0.5 % of the rows, and the
-- statements that record outcomes, release attempts and reclaim leases,
-- which join a batch of keys to the table, read the whole table in a hash
-- join: 30-97 ms a batch at 10^5 keys.
-- A unique index makes every such match one row, whatever the statistics.
-- It takes 59 bytes a key packed against the hash index's 42 (78 against
-- 48 as random keys arrive), and building it holds the table: 2.6 s per
-- 10^6 keys on a 2-core machine. As the primary key it is also the table's
-- replica identity, which logical replication of its updates needs.
ALTER TABLE /* TEMPLATE: schema */pgonce_key ADD CONSTRAINT pgonce_key_pkey PRIMARY KEY (key);
DROP INDEX /* TEMPLATE: schema */pgonce_key_key_idx;

-- +goose Down
CREATE INDEX pgonce_key_key_idx ON /* TEMPLATE: schema */pgonce_key USING hash (key);
ALTER TABLE /* TEMPLATE: schema */pgonce_key DROP CONSTRAINT pgonce_key_pkey;
