-- Keeps the response of the operation with its row, in the operation's transaction.
-- ?1 scope, ?2 key, ?3 status, ?4 header (JSON), ?5 body, ?6 not stored.
UPDATE {{table}}
SET status = ?3, header = ?4, body = ?5, not_stored = ?6
WHERE scope = ?1 AND idempotency_key = ?2
