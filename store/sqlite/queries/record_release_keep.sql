-- Releases the holder's in-flight record whose recovery point advanced (SPEC §13): its
-- committed steps must not run again, so the record stays, with no holder and its
-- lease ended at :now, for a retry or the completer to resume at once; fenced.
UPDATE idem_records
SET token     = '',
    lease_end = :now
WHERE scope = :scope AND key = :key AND state = 'in_flight' AND token = :token
  AND recovery_point <> ''
