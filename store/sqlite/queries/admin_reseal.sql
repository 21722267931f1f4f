-- Replaces a record's sealed response body and step results in place
-- (admin.Resealer.RecordReseal): each only when given (not NULL), and only while the
-- record has that id and still holds the old value (a compare-and-swap). No row: it
-- changed, or is gone.
UPDATE idem_records
SET response_body = CASE WHEN :body IS NULL THEN response_body ELSE :body END,
    steps         = CASE WHEN :steps IS NULL THEN steps ELSE :steps END
WHERE scope = :scope AND key = :key AND record_id = :id
  AND (:body IS NULL OR response_body = :old_body)
  AND (:steps IS NULL OR steps = :old_steps)
