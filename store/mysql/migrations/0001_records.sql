-- idem_records holds one idempotency record per (scope, key) (SPEC §5).
--
-- Scope and key are bytes (VARBINARY): compared, ordered and listed byte for byte as
-- in the other stores, whatever the database's collation. Times are BIGINT unix
-- nanoseconds of the clock the store is given (its host's by default), so that tests
-- inject time and no DATETIME precision or time zone is involved. MySQL's DDL commits
-- by itself: every statement here may run again after a crash between it and the
-- version's row (IF NOT EXISTS).
CREATE TABLE IF NOT EXISTS idem_records (
    scope               VARBINARY(1024) NOT NULL,
    `key`               VARBINARY(1024) NOT NULL,
    record_id           VARBINARY(255)  NOT NULL,
    fingerprint_version INT             NOT NULL,
    fingerprint         VARBINARY(64)   NOT NULL,
    state               VARCHAR(16)     NOT NULL,
    -- token and lease_end are NULL once completed.
    token               VARBINARY(255)  NULL,
    lease_end           BIGINT          NULL,
    -- The response columns are NULL while in flight.
    response_status     INT             NULL,
    response_headers    LONGBLOB        NULL, -- length-prefixed, byte for byte (internal/headercodec)
    response_body       LONGBLOB        NULL,
    response_not_stored TINYINT(1)      NOT NULL DEFAULT 0,
    outcome_unknown     TINYINT(1)      NOT NULL DEFAULT 0,
    -- Recovery points (SPEC §13): the last committed step, the results the committed
    -- steps saved (NULL until a step commits) and the operation's name.
    recovery_point      VARBINARY(255)  NOT NULL DEFAULT '',
    steps               LONGBLOB        NULL,
    operation           VARBINARY(255)  NOT NULL DEFAULT '',
    created_at          BIGINT          NOT NULL,
    expires_at          BIGINT          NOT NULL,
    -- 1 for an unfinished operation (in flight, recovery point advanced), else NULL:
    -- MySQL has no partial index, so the completer's index (idem_records_resumable)
    -- leads with this column and stays small in what it is asked for.
    resumable           TINYINT AS (IF(state = 'in_flight' AND recovery_point <> '', 1, NULL)) VIRTUAL,
    PRIMARY KEY (scope, `key`),
    -- The cleaner deletes by expires_at (SPEC §8).
    INDEX idem_records_expires_at (expires_at),
    -- The completer's and the listing's unfinished operations, in (scope, key) order.
    INDEX idem_records_resumable (resumable, scope, `key`),
    CONSTRAINT idem_records_state CHECK (state IN ('in_flight', 'completed'))
) ENGINE = InnoDB;

