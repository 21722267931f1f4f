-- Charges and orders of the reference payments API (SPEC §11).
-- (scope, idempotency_key) is unique so that a re-execution of a request whose
-- idempotency record was lost (a store without SPEC §7 transactions, or a record that
-- expired) finds the object it already created instead of creating a second one.
CREATE TABLE IF NOT EXISTS charges (
    id                  TEXT   PRIMARY KEY,
    scope               TEXT   NOT NULL,
    amount              INTEGER NOT NULL,
    currency            TEXT   NOT NULL,
    customer_id         TEXT,
    status              TEXT   NOT NULL,
    created             INTEGER NOT NULL,
    idempotency_key     TEXT,
    request_fingerprint TEXT,
    CONSTRAINT charges_scope_idempotency_key_key UNIQUE (scope, idempotency_key)
);

CREATE INDEX IF NOT EXISTS charges_scope_created_id_idx ON charges (scope, created DESC, id DESC);

CREATE TABLE IF NOT EXISTS orders (
    scope               TEXT   NOT NULL,
    id                  TEXT   NOT NULL,
    amount              INTEGER NOT NULL,
    currency            TEXT   NOT NULL,
    description         TEXT,
    status              TEXT   NOT NULL,
    created             INTEGER NOT NULL,
    updated             INTEGER NOT NULL,
    idempotency_key     TEXT,
    request_fingerprint TEXT,
    CONSTRAINT orders_pkey PRIMARY KEY (scope, id),
    CONSTRAINT orders_scope_idempotency_key_key UNIQUE (scope, idempotency_key)
);
