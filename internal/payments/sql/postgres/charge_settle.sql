-- A pending charge settles once (SPEC §13): succeeded with the card processor's charge,
-- or failed when the processor refused it. No row: it is not pending (any more). Its
-- key expires no sooner than $5, when the key's record does: a TTL after the
-- completion, for a charge that outlived its TTL pending.
UPDATE charges
SET status = $3, processor_charge_id = $4,
    key_expires_at = CASE WHEN key_expires_at IS NULL THEN NULL ELSE greatest(key_expires_at, $5) END
WHERE scope = $1 AND id = $2 AND status = 'pending'
RETURNING id, amount, currency, customer_id, status, created, idempotency_key, request_fingerprint, key_expires_at, processor_charge_id;
