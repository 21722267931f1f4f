-- Keyset pagination under either of the principal's scopes ($1 and $2, as
-- charge_get_either): the page after the cursor charge in (created, id) DESC order.
SELECT * FROM (
    (SELECT id, amount, currency, customer_id, status, created, idempotency_key, request_fingerprint, key_expires_at, processor_charge_id
     FROM charges WHERE scope = $1 AND (created, id) < ($3, $4) ORDER BY created DESC, id DESC LIMIT $5)
    UNION ALL
    (SELECT id, amount, currency, customer_id, status, created, idempotency_key, request_fingerprint, key_expires_at, processor_charge_id
     FROM charges WHERE scope = $2 AND (created, id) < ($3, $4) ORDER BY created DESC, id DESC LIMIT $5)
) AS c
ORDER BY created DESC, id DESC
LIMIT $5;
