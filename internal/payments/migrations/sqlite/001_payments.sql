-- Charges and orders of the reference payments API (SPEC §11).
--
-- A live idempotency key is unique per principal: (scope, idempotency_key) among rows
-- whose key_retired is false. A re-execution of a request whose idempotency record was
-- lost (a store without SPEC §7 transactions, or a lapsed lease) thus finds the object
-- its key already wrote instead of writing a second one. Once the key's record expired
-- (key_expires_at, unix milliseconds: arrival + TTL) the key may start a new operation
-- (SPEC §8): the old row is retired, keeping idempotency_key for its rendering.
CREATE TABLE IF NOT EXISTS charges (
    id                  TEXT    PRIMARY KEY,
    scope               TEXT    NOT NULL,
    amount              INTEGER NOT NULL,
    currency            TEXT    NOT NULL,
    customer_id         TEXT,
    status              TEXT    NOT NULL,
    created             INTEGER NOT NULL,
    idempotency_key     TEXT,
    request_fingerprint TEXT,
    key_expires_at      INTEGER,
    key_retired         INTEGER NOT NULL DEFAULT 0
);

CREATE UNIQUE INDEX IF NOT EXISTS charges_scope_idempotency_key_idx ON charges (scope, idempotency_key) WHERE key_retired = 0;

CREATE INDEX IF NOT EXISTS charges_scope_created_id_idx ON charges (scope, created DESC, id DESC);

CREATE TABLE IF NOT EXISTS orders (
    scope               TEXT    NOT NULL,
    id                  TEXT    NOT NULL,
    amount              INTEGER NOT NULL,
    currency            TEXT    NOT NULL,
    description         TEXT,
    status              TEXT    NOT NULL,
    created             INTEGER NOT NULL,
    updated             INTEGER NOT NULL,
    idempotency_key     TEXT,
    request_fingerprint TEXT,
    key_expires_at      INTEGER,
    key_retired         INTEGER NOT NULL DEFAULT 0,
    CONSTRAINT orders_pkey PRIMARY KEY (scope, id)
);

CREATE UNIQUE INDEX IF NOT EXISTS orders_scope_idempotency_key_idx ON orders (scope, idempotency_key) WHERE key_retired = 0;
