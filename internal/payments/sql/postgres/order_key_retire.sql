-- The key's record expired: the key may start a new operation (SPEC §8). The order it
-- wrote keeps the key for its rendering, retired too if it still carries it.
WITH retired AS (
    UPDATE order_keys
    SET key_retired = true
    WHERE scope = $1 AND idempotency_key = $2 AND NOT key_retired
)
UPDATE orders
SET key_retired = true
WHERE scope = $1 AND idempotency_key = $2 AND NOT key_retired;
