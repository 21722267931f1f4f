-- The columns of a record, in scanRecord's order; the other record queries append
-- FROM and WHERE to it.
SELECT scope, `key`, record_id, fingerprint_version, fingerprint, state, token, lease_end,
       response_status, response_headers, response_body, response_not_stored, outcome_unknown,
       recovery_point, steps, operation, created_at, expires_at
FROM idem_records
