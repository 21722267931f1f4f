-- The key's record expired: the key may start a new operation (SPEC §8).
UPDATE orders
SET key_retired = 1
WHERE scope = ?1 AND id = ?2;
