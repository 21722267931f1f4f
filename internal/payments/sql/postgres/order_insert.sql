-- No row when the order exists already (a concurrent PUT created it): the caller
-- then replaces it.
INSERT INTO orders (scope, id, amount, currency, description, status, created, updated, idempotency_key, request_fingerprint, key_expires_at, key_created)
VALUES ($1, $2, $3, $4, $5, $6, $7, $7, $8, $9, $10, true)
ON CONFLICT (scope, id) DO NOTHING
RETURNING id, amount, currency, description, status, created, updated, idempotency_key, request_fingerprint, key_expires_at, key_created;
