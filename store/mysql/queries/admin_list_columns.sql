-- The columns of a listed record, in scanListed's order: the body's length, never the
-- body (admin.Store.RecordList).
SELECT scope, `key`, record_id, fingerprint_version, fingerprint, state, lease_end,
       response_status, coalesce(length(response_body), 0), response_not_stored,
       recovery_point, created_at, expires_at, outcome_unknown, operation
