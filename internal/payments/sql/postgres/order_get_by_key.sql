SELECT id, amount, currency, description, status, created, updated, idempotency_key, request_fingerprint
FROM orders
WHERE scope = $1 AND idempotency_key = $2;
