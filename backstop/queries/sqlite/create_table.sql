-- The backstop's table: one row per (scope, key) whose operation committed its writes,
-- with the response that the operation answered. Times are unix milliseconds.
CREATE TABLE IF NOT EXISTS {{table}} (
    scope           BLOB    NOT NULL,
    idempotency_key BLOB    NOT NULL,
    fingerprint     TEXT    NOT NULL,
    created_at      INTEGER NOT NULL,
    expires_at      INTEGER NOT NULL,
    status          INTEGER,
    header          BLOB,
    body            BLOB,
    not_stored      INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (scope, idempotency_key)
)
