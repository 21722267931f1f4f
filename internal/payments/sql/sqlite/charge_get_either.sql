-- A charge of the principal under either of its scopes (?1 and ?2: the plain one and,
-- under a keyring, the keyed one, SPEC §19): sealing keeps a charge under its record's scope.
SELECT id, amount, currency, customer_id, status, created, idempotency_key, request_fingerprint, key_expires_at, processor_charge_id
FROM charges
WHERE scope IN (?1, ?2) AND id = ?3;
