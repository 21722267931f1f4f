-- idem_records holds one idempotency record per (scope, key) (SPEC §5).
--
-- Times are integer unix nanoseconds of the host clock. The table keeps its rowid
-- (no WITHOUT ROWID): rows carry response bodies up to the storage limit, and SQLite
-- advises WITHOUT ROWID only for rows well under a page.
CREATE TABLE idem_records (
    scope               TEXT    NOT NULL,
    key                 TEXT    NOT NULL,
    record_id           TEXT    NOT NULL,
    fingerprint_version INTEGER NOT NULL,
    fingerprint         BLOB    NOT NULL,
    state               TEXT    NOT NULL CHECK (state IN ('in_flight', 'completed')),
    -- token and lease_end are NULL once completed.
    token               TEXT,
    lease_end           INTEGER,
    -- The response columns are NULL while in flight.
    response_status     INTEGER,
    response_headers    BLOB,   -- length-prefixed, byte for byte (headers.go)
    response_body       BLOB,
    response_not_stored INTEGER NOT NULL DEFAULT 0,
    recovery_point      TEXT    NOT NULL DEFAULT '', -- reserved (SPEC §13)
    created_at          INTEGER NOT NULL,
    expires_at          INTEGER NOT NULL,
    PRIMARY KEY (scope, key)
);

-- The cleaner deletes by expires_at (SPEC §8).
CREATE INDEX idem_records_expires_at ON idem_records (expires_at);
