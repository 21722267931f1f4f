-- Deletes one batch of a scope's records, sparing (unless :force) those in flight
-- under a live lease at :now and (unless :abandon) unfinished operations, in flight
-- after a step committed (admin.Store.RecordDeleteScope).
DELETE FROM idem_records
WHERE rowid IN (
    SELECT rowid FROM idem_records
    WHERE scope = :scope AND (:force OR NOT (state = 'in_flight' AND lease_end > :now))
      AND (:abandon OR NOT (state = 'in_flight' AND recovery_point <> ''))
    LIMIT :limit
)
