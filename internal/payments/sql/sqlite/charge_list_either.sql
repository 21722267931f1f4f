-- The principal's charges under either of its scopes (?1 and ?2, as charge_get_either),
-- newest first: each scope's page by its index, merged.
SELECT * FROM (SELECT id, amount, currency, customer_id, status, created, idempotency_key, request_fingerprint, key_expires_at, processor_charge_id
               FROM charges WHERE scope = ?1 ORDER BY created DESC, id DESC LIMIT ?3)
UNION ALL
SELECT * FROM (SELECT id, amount, currency, customer_id, status, created, idempotency_key, request_fingerprint, key_expires_at, processor_charge_id
               FROM charges WHERE scope = ?2 ORDER BY created DESC, id DESC LIMIT ?3)
ORDER BY created DESC, id DESC
LIMIT ?3;
