-- One page of the unfinished operations (SPEC §13) in (scope, key) order after the
-- cursor, of one scope only unless it is NULL, along idem_records_resumable.
-- Arguments: after_scope, after_scope, after_key, scope, scope, limit.
FROM idem_records FORCE INDEX (idem_records_resumable)
WHERE resumable = 1
  AND (scope > ? OR (scope = ? AND `key` > ?)) AND (? IS NULL OR scope = ?)
ORDER BY resumable, scope, `key`
LIMIT ?
