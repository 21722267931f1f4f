-- The charge insert of the pipelined path (InTxBatch): no ON CONFLICT, so that a live
-- charge of the same (scope, idempotency_key) raises unique_violation and aborts the
-- transaction before its queued COMMIT; the handler then takes the read-then-write path.
INSERT INTO charges (id, scope, amount, currency, customer_id, status, created, idempotency_key, request_fingerprint, key_expires_at, processor_charge_id)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11);
