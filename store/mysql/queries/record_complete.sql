-- Stores the final response; fenced by the holder's token and the in-flight state. The
-- record expires at created_at + ttl, or, when its recovery point advanced, a ttl after
-- the completion at now (SPEC §13). MySQL assigns left to right, each assignment
-- seeing the ones before it: expires_at reads recovery_point before it is cleared.
-- Arguments: now, ttl, status, headers, body, not_stored, scope, key, token.
UPDATE idem_records
SET expires_at          = IF(recovery_point = '', created_at, GREATEST(created_at, ?)) + ?,
    state               = 'completed',
    token               = NULL,
    lease_end           = NULL,
    response_status     = ?,
    response_headers    = ?,
    response_body       = ?,
    response_not_stored = ?,
    recovery_point      = ''
WHERE scope = ? AND `key` = ? AND state = 'in_flight' AND token = ?
