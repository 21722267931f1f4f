-- The row of (scope, key). $1 scope, $2 key.
SELECT fingerprint, status, header, body, not_stored
FROM {{table}}
WHERE scope = $1 AND idempotency_key = $2
