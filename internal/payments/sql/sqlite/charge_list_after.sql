-- Keyset pagination: the page after the cursor charge in (created, id) DESC order.
SELECT id, amount, currency, customer_id, status, created, idempotency_key, request_fingerprint, key_expires_at, processor_charge_id
FROM charges
WHERE scope = ?1 AND (created, id) < (?2, ?3)
ORDER BY created DESC, id DESC
LIMIT ?4;
