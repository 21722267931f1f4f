-- Deletes the holder's in-flight record so that a retry executes afresh; fenced.
DELETE FROM idem_records
WHERE scope = :scope AND key = :key AND state = 'in_flight' AND token = :token
