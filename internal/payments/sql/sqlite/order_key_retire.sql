-- The key's record expired: the key may start a new operation (SPEC §8). The order it
-- wrote keeps the key for its rendering, retired too if it still carries it.
UPDATE orders
SET key_retired = 1
WHERE scope = ?1 AND idempotency_key = ?2 AND key_retired = 0;

UPDATE order_keys
SET key_retired = 1
WHERE scope = ?1 AND idempotency_key = ?2 AND key_retired = 0;
