-- Deletes one record; the caller judged its lease under the row's lock
-- (admin.Store.RecordDelete).
DELETE FROM idem_records WHERE scope = ? AND `key` = ?
