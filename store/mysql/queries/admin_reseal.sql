-- Replaces a record's sealed response body and sealed step results
-- (admin.Resealer.RecordReseal): each only when given (not NULL), and only while the
-- record has that id and still holds the old value (a compare-and-swap). No row
-- matched: it changed, or is gone. Arguments: body, body, steps, steps, scope, key, id,
-- body, old body, steps, old steps.
UPDATE idem_records
SET response_body = CASE WHEN ? IS NULL THEN response_body ELSE ? END,
    steps         = CASE WHEN ? IS NULL THEN steps ELSE ? END
WHERE scope = ? AND `key` = ? AND record_id = ?
  AND (? IS NULL OR response_body = ?)
  AND (? IS NULL OR steps = ?)
