SELECT id, amount, currency, customer_id, status, created, idempotency_key, request_fingerprint, key_expires_at, processor_charge_id
FROM charges
WHERE scope = ?1 AND id = ?2;
