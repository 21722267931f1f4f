-- The charges of the fake card processor (idem processor). seq orders them as they
-- were made, so that a list is newest first even within one second.
CREATE TABLE IF NOT EXISTS processor_charges (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    id              TEXT    NOT NULL UNIQUE,
    amount          INTEGER NOT NULL,
    currency        TEXT    NOT NULL,
    idempotency_key TEXT    NOT NULL,
    created         INTEGER NOT NULL
);
