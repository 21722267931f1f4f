-- Deletes one record; the caller judged its lease under the same write lock
-- (admin.Store.RecordDelete).
DELETE FROM idem_records WHERE scope = :scope AND key = :key
