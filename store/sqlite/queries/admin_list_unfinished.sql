-- One page of the unfinished operations (SPEC §13: in flight, recovery point advanced)
-- in (scope, key) order after (:after_scope, :after_key), of :scope only unless it is
-- NULL, along the partial index idem_records_resumable (admin.Store.RecordList).
SELECT scope, key, record_id, fingerprint_version, fingerprint, state, lease_end,
       response_status, coalesce(length(response_body), 0), response_not_stored,
       recovery_point, created_at, expires_at, outcome_unknown, operation
FROM idem_records
WHERE state = 'in_flight' AND recovery_point <> ''
  AND (scope, key) > (:after_scope, :after_key) AND (:scope IS NULL OR scope = :scope)
ORDER BY scope, key
LIMIT :limit
