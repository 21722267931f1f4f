-- The charges of the fake card processor (idem processor). seq orders them as they
-- were made, so that a list is newest first even within one second.
CREATE TABLE IF NOT EXISTS processor_charges (
    seq             bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id              text    NOT NULL UNIQUE,
    amount          bigint  NOT NULL,
    currency        text    NOT NULL,
    idempotency_key text    NOT NULL,
    created         bigint  NOT NULL
);
