-- Extends the holder's lease; fenced. expires_at stays max(created_at + ttl,
-- lease_end). Arguments: lease_end, ttl, lease_end, scope, key, token.
UPDATE idem_records
SET lease_end  = ?,
    expires_at = GREATEST(created_at + ?, ?)
WHERE scope = ? AND `key` = ? AND state = 'in_flight' AND token = ?
