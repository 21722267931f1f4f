-- order_keys records each idempotency key that wrote an order (a POST, a keyed PUT)
-- with the response it answered, apart from the order, so that neither a later PUT
-- (which writes its own key, or none, on the order) nor a DELETE erases it. When the
-- key's idempotency record is lost (a Redis store) its retry is answered that first
-- response, and creates no second order (issue 9). Once the key's record expired
-- (key_expires_at) the row is retired and the key may start a new operation (SPEC §8).
CREATE TABLE IF NOT EXISTS order_keys (
    scope               TEXT    NOT NULL,
    idempotency_key     TEXT    NOT NULL,
    order_id            TEXT    NOT NULL,
    request_fingerprint TEXT,
    key_expires_at      INTEGER NOT NULL,
    status              INTEGER NOT NULL,
    -- The body first answered; NULL for keys recorded before this table existed, which
    -- are answered with the order as it is now.
    body                BLOB,
    key_retired         INTEGER NOT NULL DEFAULT 0
);

CREATE UNIQUE INDEX IF NOT EXISTS order_keys_scope_idempotency_key_idx ON order_keys (scope, idempotency_key) WHERE key_retired = 0;

INSERT INTO order_keys (scope, idempotency_key, order_id, request_fingerprint, key_expires_at, status)
SELECT scope, idempotency_key, id, request_fingerprint, key_expires_at, CASE WHEN key_created THEN 201 ELSE 200 END
FROM orders
WHERE idempotency_key IS NOT NULL AND key_expires_at IS NOT NULL AND key_retired = 0;
