-- Extends the holder's lease; fenced. expires_at stays max(created_at + ttl, lease_end).
UPDATE idem_records
SET lease_end  = :lease_end,
    expires_at = max(created_at + :ttl, :lease_end)
WHERE scope = :scope AND key = :key AND state = 'in_flight' AND token = :token
