-- Claims an absent key (idem.DecideClaim) in one statement: a duplicate key (1062)
-- means another claim committed first, or is committing (the insert waited for it),
-- and the caller reads again.
INSERT INTO idem_records (
    scope, `key`, record_id, fingerprint_version, fingerprint, state, token, lease_end,
    created_at, expires_at
) VALUES (?, ?, ?, ?, ?, 'in_flight', ?, ?, ?, ?)
