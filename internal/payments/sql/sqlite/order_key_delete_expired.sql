-- Deletes at most ?2 rows of order_keys whose key expired by ?1 (unix ms), oldest
-- first.
DELETE FROM order_keys
WHERE rowid IN (
    SELECT rowid FROM order_keys
    WHERE key_expires_at <= ?1
    ORDER BY key_expires_at
    LIMIT ?2
);
