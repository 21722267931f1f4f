-- Completes a key whose outcome is unknown, or whose operation is unfinished, with the
-- operator's response (admin.Store.RecordResolve); the record must be as
-- admin_resolve_release.sql says. An outcome-unknown record keeps its expiry; an
-- unfinished one expires its TTL (expires_at - created_at) after :now.
UPDATE idem_records
SET state               = 'completed',
    token               = NULL,
    lease_end           = NULL,
    response_status     = :status,
    response_headers    = :headers,
    response_body       = :body,
    response_not_stored = 0,
    outcome_unknown     = 0,
    recovery_point      = '',
    expires_at          = CASE WHEN state = 'in_flight' THEN :now + (expires_at - created_at) ELSE expires_at END
WHERE scope = :scope AND key = :key
  AND ((outcome_unknown AND expires_at > :now)
       OR (state = 'in_flight' AND recovery_point <> '' AND lease_end <= :now))
