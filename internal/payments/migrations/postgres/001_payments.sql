-- Charges and orders of the reference payments API (SPEC §11).
-- (scope, idempotency_key) is unique so that a re-execution of a request whose
-- idempotency record was lost (a store without SPEC §7 transactions, or a record that
-- expired) finds the object it already created instead of creating a second one.
CREATE TABLE IF NOT EXISTS charges (
    id                  text   PRIMARY KEY,
    scope               text   NOT NULL,
    amount              bigint NOT NULL,
    currency            text   NOT NULL,
    customer_id         text,
    status              text   NOT NULL,
    created             bigint NOT NULL,
    idempotency_key     text,
    request_fingerprint text,
    CONSTRAINT charges_scope_idempotency_key_key UNIQUE (scope, idempotency_key)
);

CREATE INDEX IF NOT EXISTS charges_scope_created_id_idx ON charges (scope, created DESC, id DESC);

CREATE TABLE IF NOT EXISTS orders (
    scope               text   NOT NULL,
    id                  text   NOT NULL,
    amount              bigint NOT NULL,
    currency            text   NOT NULL,
    description         text,
    status              text   NOT NULL,
    created             bigint NOT NULL,
    updated             bigint NOT NULL,
    idempotency_key     text,
    request_fingerprint text,
    CONSTRAINT orders_pkey PRIMARY KEY (scope, id),
    CONSTRAINT orders_scope_idempotency_key_key UNIQUE (scope, idempotency_key)
);
