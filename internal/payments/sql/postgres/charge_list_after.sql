-- Keyset pagination: the page after the charge ($2, $3) in (created, id) DESC order.
SELECT id, amount, currency, customer_id, status, created, idempotency_key, request_fingerprint
FROM charges
WHERE scope = $1 AND (created, id) < ($2, $3)
ORDER BY created DESC, id DESC
LIMIT $4;
