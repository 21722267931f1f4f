-- One page of every scope's records in (scope, key) order after (:after_scope,
-- :after_key), along the primary key (admin.Store.RecordList), but idem's own
-- (:reserved, idemstore.ReservedScope), which a list of that scope shows.
SELECT scope, key, record_id, fingerprint_version, fingerprint, state, lease_end,
       response_status, coalesce(length(response_body), 0), response_not_stored,
       recovery_point, created_at, expires_at, outcome_unknown, operation
FROM idem_records
WHERE (scope, key) > (:after_scope, :after_key) AND (:state = '' OR state = :state)
  AND (NOT :outcome_unknown OR outcome_unknown) AND scope <> :reserved
ORDER BY scope, key
LIMIT :limit
