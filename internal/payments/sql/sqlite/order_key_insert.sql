-- Records the key that wrote an order and the response it answered. A live key is
-- unique per principal: a second execution of one key fails the UNIQUE constraint.
INSERT INTO order_keys (scope, idempotency_key, order_id, request_fingerprint, key_expires_at, status, body)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7);
