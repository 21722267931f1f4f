-- Releases a key whose outcome is unknown (admin.Store.RecordResolve): deletes its
-- record, which must be completed as outcome unknown and not expired at :now.
DELETE FROM idem_records
WHERE scope = :scope AND key = :key AND outcome_unknown AND expires_at > :now
