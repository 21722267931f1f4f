-- One page of a scope's records in key order after the cursor, along the primary key.
-- Arguments: scope, after_key, state, state, outcome_unknown, limit.
FROM idem_records
WHERE scope = ? AND `key` > ? AND (? = '' OR state = ?)
  AND (NOT ? OR outcome_unknown)
ORDER BY `key`
LIMIT ?
