-- Claims a key whose record expired (idem.DecideClaim), wholesale. The caller holds the
-- row's lock (record_lock.sql) and judged it expired under it.
UPDATE idem_records
SET record_id           = ?,
    fingerprint_version = ?,
    fingerprint         = ?,
    state               = 'in_flight',
    token               = ?,
    lease_end           = ?,
    response_status     = NULL,
    response_headers    = NULL,
    response_body       = NULL,
    response_not_stored = 0,
    outcome_unknown     = 0,
    recovery_point      = '',
    steps               = NULL,
    operation           = '',
    created_at          = ?,
    expires_at          = ?
WHERE scope = ? AND `key` = ?
