-- The idempotency records (SPEC §5). {{schema}} is replaced by the configured schema,
-- quoted, followed by a dot (or by nothing, which means the search_path).
CREATE TABLE {{schema}}idem_records (
    -- Scope and key are bytes: a scope may hold any bytes, NUL and invalid UTF-8
    -- included, which text cannot.
    scope               bytea       NOT NULL,
    key                 bytea       NOT NULL,
    -- New at every claim of an absent or expired key, kept across takeovers (§13).
    id                  text        NOT NULL,
    fingerprint_version integer     NOT NULL,
    fingerprint         bytea       NOT NULL,
    state               text        NOT NULL CHECK (state IN ('in_flight', 'completed')),
    -- The holder's lock token; NULL once completed.
    lock_token          text,
    -- When the holder's lease lapses; NULL once completed.
    lease_end           timestamptz,
    response_status     integer,
    -- The stored (allow-listed) headers, byte for byte (header values may hold
    -- obs-text, which is not UTF-8), in the length-prefixed form of headers.go.
    response_headers    bytea,
    response_body       bytea,
    response_not_stored boolean     NOT NULL DEFAULT false,
    -- Reserved for resumable handlers (§13).
    recovery_point      text,
    created_at          timestamptz NOT NULL,
    -- created_at + ttl once completed; max(created_at + ttl, lease_end) in flight (§8).
    expires_at          timestamptz NOT NULL,
    PRIMARY KEY (scope, key)
);

-- The cleaner deletes in expires_at order, in bounded batches (§8).
CREATE INDEX idem_records_expires_at_idx ON {{schema}}idem_records (expires_at);
