-- +goose Up

-- last_error keeps, on the key, why its last attempt did not succeed: the
-- outbox row that also holds it is deleted when the key is finished, and an
-- operator reviewing a key needs to know why it is in review.
ALTER TABLE pgonce_key ADD COLUMN last_error text;

-- +goose Down
ALTER TABLE pgonce_key DROP COLUMN last_error;
