SELECT order_id, request_fingerprint, key_expires_at, status, body
FROM order_keys
WHERE scope = $1 AND idempotency_key = $2 AND NOT key_retired;
