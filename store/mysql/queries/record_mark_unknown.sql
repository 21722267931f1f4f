-- Completes an in-flight record whose holder's lease lapsed as outcome unknown
-- (idem.DecideUnknown, SPEC §13), fenced by the old token as a takeover is. It
-- expires at created_at + ttl, or, for an unfinished operation, a ttl after now.
-- Arguments: now, ttl, scope, key, old token.
UPDATE idem_records
SET expires_at          = IF(recovery_point = '', created_at, GREATEST(created_at, ?)) + ?,
    state               = 'completed',
    token               = NULL,
    lease_end           = NULL,
    response_status     = 500,
    response_headers    = NULL,
    response_body       = NULL,
    response_not_stored = 0,
    outcome_unknown     = 1
WHERE scope = ? AND `key` = ? AND state = 'in_flight' AND token = ?
