-- Inserts the row of (scope, key) in the operation's transaction, or takes over an
-- expired one. A live row changes nothing (0 rows): the key's operation committed
-- before. A concurrent, uncommitted insert of the same key makes this wait for its
-- transaction to end. $1 scope, $2 key, $3 fingerprint, $4 now, $5 expires_at.
INSERT INTO {{table}} (scope, idempotency_key, fingerprint, created_at, expires_at)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (scope, idempotency_key) DO UPDATE
SET fingerprint = excluded.fingerprint,
    created_at = excluded.created_at,
    expires_at = excluded.expires_at,
    status = NULL, header = NULL, body = NULL, not_stored = false
WHERE {{table}}.expires_at <= $4
