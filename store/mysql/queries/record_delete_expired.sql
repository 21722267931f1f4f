-- Deletes one batch of records that expired before the cutoff, oldest first, never an
-- in-flight record whose lease is live at now nor an unfinished operation's (SPEC §13).
-- Arguments: cutoff, now, limit.
DELETE FROM idem_records
WHERE expires_at < ?
  AND NOT (state = 'in_flight' AND (lease_end > ? OR recovery_point <> ''))
ORDER BY expires_at
LIMIT ?
