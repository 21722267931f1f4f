UPDATE orders
SET amount = $3, currency = $4, description = $5, status = $6, updated = $7,
    idempotency_key = $8, request_fingerprint = $9, key_expires_at = $10, key_retired = false, key_created = false
WHERE scope = $1 AND id = $2
RETURNING id, amount, currency, description, status, created, updated, idempotency_key, request_fingerprint, key_expires_at, key_created;
