-- Completes an in-flight record whose holder's lease lapsed as outcome unknown
-- (idem.DecideUnknown, SPEC §13): every retry gets 500 outcome_unknown until an
-- operator resolves it. Fenced by the old token, as a takeover is.
UPDATE idem_records
SET state               = 'completed',
    token               = NULL,
    lease_end           = NULL,
    response_status     = 500,
    response_headers    = NULL,
    response_body       = NULL,
    response_not_stored = 0,
    outcome_unknown     = 1,
    expires_at          = created_at + :ttl
WHERE scope = :scope AND key = :key AND state = 'in_flight' AND token = :old_token
