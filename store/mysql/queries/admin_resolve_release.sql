-- Releases a key whose outcome is unknown or whose operation is unfinished
-- (admin.Store.RecordResolve): deletes its record, which must be completed as outcome
-- unknown and not expired at now, or in flight after a step committed (SPEC §13) with
-- its lease lapsed or ended. Arguments: scope, key, now, now.
DELETE FROM idem_records
WHERE scope = ? AND `key` = ?
  AND ((outcome_unknown AND expires_at > ?)
       OR (state = 'in_flight' AND recovery_point <> '' AND lease_end <= ?))
