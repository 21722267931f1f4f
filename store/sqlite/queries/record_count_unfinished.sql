-- The unfinished operations (SPEC §13: in flight, recovery point advanced, lease live
-- or not) and the oldest one's creation, along the partial index
-- idem_records_resumable.
SELECT count(*), min(created_at)
FROM idem_records
WHERE state = 'in_flight' AND recovery_point <> ''
