-- One batch of the records the completer may resume (SPEC §13): in flight, recovery
-- point advanced, lease lapsed or ended at now, however long ago their TTL ran out; in
-- (scope, key) order after the cursor, along idem_records_resumable. Arguments: now,
-- after_scope, after_scope, after_key, limit.
SELECT scope, `key`, record_id, fingerprint_version, fingerprint, state, token, lease_end,
       NULL, NULL, NULL, 0, 0,
       recovery_point, steps, operation, created_at, expires_at
FROM idem_records FORCE INDEX (idem_records_resumable)
WHERE resumable = 1 AND lease_end <= ?
  AND (scope > ? OR (scope = ? AND `key` > ?))
ORDER BY resumable, scope, `key`
LIMIT ?
