-- Claims an absent or expired key (idem.DecideClaim). The caller holds the write lock
-- (BEGIN IMMEDIATE) and has just read the row, so the conflict branch only ever
-- replaces an expired record, wholesale.
INSERT INTO idem_records (
    scope, key, record_id, fingerprint_version, fingerprint, state, token, lease_end,
    response_status, response_headers, response_body, response_not_stored,
    recovery_point, created_at, expires_at
) VALUES (
    :scope, :key, :record_id, :fingerprint_version, :fingerprint, 'in_flight', :token, :lease_end,
    NULL, NULL, NULL, 0,
    '', :now, :expires_at
)
ON CONFLICT (scope, key) DO UPDATE SET
    record_id           = excluded.record_id,
    fingerprint_version = excluded.fingerprint_version,
    fingerprint         = excluded.fingerprint,
    state               = excluded.state,
    token               = excluded.token,
    lease_end           = excluded.lease_end,
    response_status     = NULL,
    response_headers    = NULL,
    response_body       = NULL,
    response_not_stored = 0,
    outcome_unknown     = 0,
    recovery_point      = '',
    steps               = NULL,
    operation           = '',
    created_at          = excluded.created_at,
    expires_at          = excluded.expires_at
