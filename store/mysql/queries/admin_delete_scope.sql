-- Deletes one batch of a scope's records, sparing (unless force) those in flight under
-- a live lease at now and (unless abandon) unfinished operations
-- (admin.Store.RecordDeleteScope). Arguments: scope, force, now, abandon, limit.
DELETE FROM idem_records
WHERE scope = ? AND (? OR NOT (state = 'in_flight' AND lease_end > ?))
  AND (? OR NOT (state = 'in_flight' AND recovery_point <> ''))
LIMIT ?
