-- order_keys rows are deleted once their key expired (key_expires_at, unix ms): a
-- retry after that starts a new operation, so the row answers nothing any more. The
-- API deletes them in small batches as it writes (DB.DeleteExpiredOrderKeys), oldest
-- first, along this index.
CREATE INDEX IF NOT EXISTS order_keys_key_expires_at_idx ON order_keys (key_expires_at);
