-- One page of every scope's records in (scope, key) order after the cursor, along the
-- primary key, but idem's own (idemstore.ReservedScope), which a list of that scope
-- shows. Arguments: after_scope, after_scope, after_key, state, state,
-- outcome_unknown, reserved, limit.
FROM idem_records
WHERE (scope > ? OR (scope = ? AND `key` > ?)) AND (? = '' OR state = ?)
  AND (NOT ? OR outcome_unknown) AND scope <> ?
ORDER BY scope, `key`
LIMIT ?
