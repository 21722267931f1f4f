-- A charge by its id alone: the settle's own charge, whichever scope it keeps.
SELECT id, amount, currency, customer_id, status, created, idempotency_key, request_fingerprint, key_expires_at, processor_charge_id
FROM charges
WHERE id = ?1;
