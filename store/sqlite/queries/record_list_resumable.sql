-- One batch of the records the completer may resume (SPEC §13): in flight, recovery
-- point advanced, lease lapsed or ended at :now, however long ago their TTL ran out (an
-- unfinished operation never expires); in (scope, key) order after the cursor, along
-- the partial index idem_records_resumable.
SELECT scope, key, record_id, fingerprint_version, fingerprint, state, token, lease_end,
       NULL, NULL, NULL, 0, 0,
       recovery_point, steps, operation, created_at, expires_at
FROM idem_records
WHERE state = 'in_flight' AND recovery_point <> ''
  AND lease_end <= :now
  AND (scope, key) > (:after_scope, :after_key)
ORDER BY scope, key
LIMIT :limit
