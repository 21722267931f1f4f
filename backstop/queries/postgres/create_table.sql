-- The backstop's table: one row per (scope, key) whose operation committed its writes,
-- with the response that the operation answered. Times are unix milliseconds.
CREATE TABLE IF NOT EXISTS {{table}} (
    scope           bytea   NOT NULL,
    idempotency_key bytea   NOT NULL,
    fingerprint     text    NOT NULL,
    created_at      bigint  NOT NULL,
    expires_at      bigint  NOT NULL,
    status          integer,
    header          bytea,
    body            bytea,
    not_stored      boolean NOT NULL DEFAULT false,
    PRIMARY KEY (scope, idempotency_key)
)
