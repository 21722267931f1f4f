-- Takes over an in-flight record whose lease lapsed (idem.DecideTakeOver): new token
-- and lease; record id, created_at and fingerprint stay. Fenced by the old token so
-- that it can never overwrite a record it did not read.
UPDATE idem_records
SET token      = :token,
    lease_end  = :lease_end,
    expires_at = max(created_at + :ttl, :lease_end)
WHERE scope = :scope AND key = :key AND state = 'in_flight' AND token = :old_token
