-- A conflict on (scope, idempotency_key) inserts nothing and returns no row: the
-- caller then reads the charge that key already created.
INSERT INTO charges (id, scope, amount, currency, customer_id, status, created, idempotency_key, request_fingerprint)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
ON CONFLICT (scope, idempotency_key) DO NOTHING
RETURNING id, amount, currency, customer_id, status, created, idempotency_key, request_fingerprint;
