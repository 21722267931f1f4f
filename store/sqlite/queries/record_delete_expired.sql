-- Deletes one batch of records that expired before :cutoff, oldest first, never an
-- in-flight record whose lease is live at :now nor an unfinished operation's (in
-- flight, its recovery point advanced: SPEC §13).
DELETE FROM idem_records
WHERE rowid IN (
    SELECT rowid FROM idem_records
    WHERE expires_at < :cutoff
      AND NOT (state = 'in_flight' AND (lease_end > :now OR recovery_point <> ''))
    ORDER BY expires_at
    LIMIT :limit
)
