-- Completes a key whose outcome is unknown with the operator's response
-- (admin.Store.RecordResolve); the record must be completed as outcome unknown and not
-- expired at :now. Its expiry stays.
UPDATE idem_records
SET response_status     = :status,
    response_headers    = :headers,
    response_body       = :body,
    response_not_stored = 0,
    outcome_unknown     = 0
WHERE scope = :scope AND key = :key AND outcome_unknown AND expires_at > :now
