-- One page of a scope's records in key order after :after_key, along the primary key;
-- the body's length, never the body (admin.Store.RecordList).
SELECT scope, key, record_id, fingerprint_version, fingerprint, state, lease_end,
       response_status, coalesce(length(response_body), 0), response_not_stored,
       recovery_point, created_at, expires_at, outcome_unknown, operation
FROM idem_records
WHERE scope = :scope AND key > :after_key AND (:state = '' OR state = :state)
  AND (NOT :outcome_unknown OR outcome_unknown)
ORDER BY key
LIMIT :limit
