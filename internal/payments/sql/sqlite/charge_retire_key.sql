-- The key's record expired: the key may start a new operation (SPEC §8).
UPDATE charges
SET key_retired = 1
WHERE id = ?1;
