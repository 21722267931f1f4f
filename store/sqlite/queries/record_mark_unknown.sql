-- Completes an in-flight record whose holder's lease lapsed as outcome unknown
-- (idem.DecideUnknown, SPEC §13): every retry gets 500 outcome_unknown until an
-- operator resolves it. Fenced by the old token, as a takeover is. It expires at
-- created_at + ttl, or, for an unfinished operation, a ttl after :now (SPEC §13).
UPDATE idem_records
SET state               = 'completed',
    token               = NULL,
    lease_end           = NULL,
    response_status     = 500,
    response_headers    = NULL,
    response_body       = NULL,
    response_not_stored = 0,
    outcome_unknown     = 1,
    expires_at          = CASE WHEN recovery_point = '' THEN created_at ELSE max(created_at, :now) END + :ttl
WHERE scope = :scope AND key = :key AND state = 'in_flight' AND token = :old_token
