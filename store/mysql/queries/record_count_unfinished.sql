-- The unfinished operations (SPEC §13) and the oldest one's creation, along
-- idem_records_resumable.
SELECT count(*), min(created_at)
FROM idem_records
WHERE resumable = 1
