-- Releases the holder's in-flight record whose recovery point advanced (SPEC §13): the
-- record stays, with no holder and its lease ended at now, for a retry or the
-- completer to resume at once; fenced. Arguments: now, scope, key, token.
UPDATE idem_records
SET token     = '',
    lease_end = ?
WHERE scope = ? AND `key` = ? AND state = 'in_flight' AND token = ? AND recovery_point <> ''
