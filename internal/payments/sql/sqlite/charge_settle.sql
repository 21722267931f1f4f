-- A pending charge settles once (SPEC §13): succeeded with the card processor's charge,
-- or failed when the processor refused it. No row: it is not pending (any more). Its
-- key expires no sooner than ?4, when the key's record does: a TTL after the
-- completion, for a charge that outlived its TTL pending (max of a NULL is NULL: no key).
-- The charge is found by its id alone (the record's pending step saved it), whichever
-- scope it keeps: the plain one or the keyed one (SPEC §19), which may differ from the
-- scope of the record that settles it (a charge made before sealing began, adopted by
-- a sealed record).
UPDATE charges
SET status = ?2, processor_charge_id = ?3, key_expires_at = max(key_expires_at, ?4)
WHERE id = ?1 AND status = 'pending'
RETURNING id, amount, currency, customer_id, status, created, idempotency_key, request_fingerprint, key_expires_at, processor_charge_id;
