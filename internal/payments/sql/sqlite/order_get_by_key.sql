SELECT id, amount, currency, description, status, created, updated, idempotency_key, request_fingerprint, key_expires_at, key_created
FROM orders
WHERE scope = ?1 AND idempotency_key = ?2 AND key_retired = 0;
