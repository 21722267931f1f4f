-- A live charge of the same (scope, idempotency_key) makes this insert nothing and
-- return no row: the caller then reads that charge.
INSERT INTO charges (id, scope, amount, currency, customer_id, status, created, idempotency_key, request_fingerprint, key_expires_at, processor_charge_id)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
ON CONFLICT (scope, idempotency_key) WHERE key_retired = 0 DO NOTHING
RETURNING id, amount, currency, customer_id, status, created, idempotency_key, request_fingerprint, key_expires_at, processor_charge_id;
