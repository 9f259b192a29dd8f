-- name: AttemptListByKey :many
-- AttemptListByKey reads the attempts pgonce_attempt keeps of a key, in
-- attempt order, on its primary key.
SELECT
    pgonce_attempt.attempt,
    pgonce_attempt.started_at,
    pgonce_attempt.ended_at,
    pgonce_attempt.outcome,
    pgonce_attempt.worker,
    pgonce_attempt.error
FROM /* TEMPLATE: schema */pgonce_attempt
WHERE pgonce_attempt.key = @key::bytea
ORDER BY pgonce_attempt.attempt;
