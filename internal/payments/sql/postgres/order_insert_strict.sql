-- The order insert of the pipelined path (InTxBatch): no ON CONFLICT, so that an order
-- already written by the same idempotency key raises unique_violation and aborts the
-- transaction before its queued COMMIT; the handler then takes the read-then-write path.
INSERT INTO orders (scope, id, amount, currency, description, status, created, updated, idempotency_key, request_fingerprint, key_expires_at, key_created)
VALUES ($1, $2, $3, $4, $5, $6, $7, $7, $8, $9, $10, true);
