-- Deletes the holder's in-flight record so that a retry executes afresh; fenced. A
-- record whose recovery point advanced is never deleted (record_release_keep.sql).
DELETE FROM idem_records
WHERE scope = ? AND `key` = ? AND state = 'in_flight' AND token = ? AND recovery_point = ''
