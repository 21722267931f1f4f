-- Completes a key whose outcome is unknown, or whose operation is unfinished, with the
-- operator's response (admin.Store.RecordResolve). An outcome-unknown record keeps its
-- expiry; an unfinished one expires its TTL (expires_at - created_at) after now.
-- Assignments run left to right: expires_at first, while state is still the old one.
-- Arguments: now, status, headers, body, scope, key, now, now.
UPDATE idem_records
SET expires_at          = IF(state = 'in_flight', ? + (expires_at - created_at), expires_at),
    state               = 'completed',
    token               = NULL,
    lease_end           = NULL,
    response_status     = ?,
    response_headers    = ?,
    response_body       = ?,
    response_not_stored = 0,
    outcome_unknown     = 0,
    recovery_point      = ''
WHERE scope = ? AND `key` = ?
  AND ((outcome_unknown AND expires_at > ?)
       OR (state = 'in_flight' AND recovery_point <> '' AND lease_end <= ?))
