-- Takes over an in-flight record whose lease lapsed (idem.DecideTakeOver): new token
-- and lease; record id, created_at and fingerprint stay. Fenced by the old token so
-- that it can never overwrite a record it did not read. Arguments: token, lease_end,
-- ttl, lease_end, scope, key, old token.
UPDATE idem_records
SET token      = ?,
    lease_end  = ?,
    expires_at = GREATEST(created_at + ?, ?)
WHERE scope = ? AND `key` = ? AND state = 'in_flight' AND token = ?
