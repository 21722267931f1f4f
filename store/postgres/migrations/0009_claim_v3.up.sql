-- idem_claim_v3 is the insert of RecordClaim for a key without a record (issue 21): a
-- plain INSERT, where idem_claim_v2 (0006) read the key again and inserted with
-- INSERT … ON CONFLICT DO NOTHING in a loop. The speculative insertion of ON CONFLICT
-- writes one more WAL record for every new key (HEAP_CONFIRM; benchtool wal), and the
-- read repeated RecordClaim's own. RecordClaim calls it only when its read of the key
-- found nothing, so a replay never pays for a function call (0006 says why that
-- matters). A record of the key that a concurrent claim committed after RecordClaim's
-- snapshot fails the INSERT with unique_violation (23505), after waiting for that
-- claim's transaction: the caller runs RecordClaim again, whose read then finds it.
--
-- When p_async is true the transaction of the calling statement commits without
-- waiting for the WAL flush (set_config(…, true) is SET LOCAL); see doc.go, "Durable
-- claims". Durations are microseconds; p_now NULL means the store's clock
-- (clock_timestamp()). The columns are those of idem_claim_v2.
CREATE FUNCTION {{schema}}idem_claim_v3(
    p_scope bytea, p_key bytea, p_id text, p_fingerprint_version integer, p_fingerprint bytea,
    p_token text, p_lease bigint, p_ttl bigint, p_now timestamptz, p_async boolean)
RETURNS TABLE (
    claimed boolean, id text, fingerprint_version integer, fingerprint bytea, state text,
    lock_token text, lease_end timestamptz, response_status integer, response_headers bytea,
    response_body bytea, response_not_stored boolean, outcome_unknown boolean,
    recovery_point text, steps bytea, operation text, created_at timestamptz,
    expires_at timestamptz, now timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    t timestamptz := coalesce(p_now, clock_timestamp());
BEGIN
    IF p_async THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    RETURN QUERY
        INSERT INTO {{schema}}idem_records AS r
            (scope, key, id, fingerprint_version, fingerprint, state, lock_token, lease_end,
             created_at, expires_at)
        VALUES (p_scope, p_key, p_id, p_fingerprint_version, p_fingerprint, 'in_flight', p_token,
                t + p_lease * interval '1 microsecond',
                t,
                greatest(t + p_ttl * interval '1 microsecond', t + p_lease * interval '1 microsecond'))
        RETURNING true, r.id, r.fingerprint_version, r.fingerprint, r.state, r.lock_token,
                  r.lease_end, r.response_status, r.response_headers, r.response_body,
                  r.response_not_stored, r.outcome_unknown, r.recovery_point, r.steps, r.operation,
                  r.created_at, r.expires_at, t;
END
$$;
