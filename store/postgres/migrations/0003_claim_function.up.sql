-- idem_claim is RecordClaim's work on the server: read the record by its primary key and
-- return it, or, when there is none, insert the in-flight record and return that. It
-- replaces a CTE that planned the read, the conditional INSERT and a UNION ALL on every
-- call: PL/pgSQL keeps each statement's plan, and a replay runs only the read.
--
-- At READ COMMITTED every statement of a VOLATILE function takes a new snapshot, so when
-- the INSERT meets a row that a concurrent claim committed after the read's snapshot
-- (ON CONFLICT DO NOTHING: nothing written, no row returned), the next turn of the loop
-- reads that row: the race costs a statement, not a round trip. After a few turns (a
-- key inserted and deleted again each time) it returns no row and the caller retries.
--
-- When async is true the transaction of the calling statement commits without waiting
-- for the WAL flush (set_config(…, true) is SET LOCAL); see doc.go, "Durable claims".
-- Durations are microseconds; now NULL means the store's clock (clock_timestamp()).
-- The columns are those scanRecord reads, after claimed and before the store's time.
CREATE FUNCTION {{schema}}idem_claim(
    p_scope bytea, p_key bytea, p_id text, p_fingerprint_version integer, p_fingerprint bytea,
    p_token text, p_lease bigint, p_ttl bigint, p_now timestamptz, p_async boolean)
RETURNS TABLE (
    claimed boolean, id text, fingerprint_version integer, fingerprint bytea, state text,
    lock_token text, lease_end timestamptz, response_status integer, response_headers bytea,
    response_body bytea, response_not_stored boolean, recovery_point text,
    created_at timestamptz, expires_at timestamptz, now timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    t timestamptz;
BEGIN
    IF p_async THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    FOR attempt IN 1..4 LOOP
        t := coalesce(p_now, clock_timestamp());
        RETURN QUERY
            SELECT false, r.id, r.fingerprint_version, r.fingerprint, r.state, r.lock_token,
                   r.lease_end, r.response_status, r.response_headers, r.response_body,
                   r.response_not_stored, r.recovery_point, r.created_at, r.expires_at, t
            FROM {{schema}}idem_records r
            WHERE r.scope = p_scope AND r.key = p_key;
        IF FOUND THEN
            RETURN;
        END IF;
        RETURN QUERY
            INSERT INTO {{schema}}idem_records AS r
                (scope, key, id, fingerprint_version, fingerprint, state, lock_token, lease_end,
                 created_at, expires_at)
            VALUES (p_scope, p_key, p_id, p_fingerprint_version, p_fingerprint, 'in_flight', p_token,
                    t + p_lease * interval '1 microsecond',
                    t,
                    greatest(t + p_ttl * interval '1 microsecond', t + p_lease * interval '1 microsecond'))
            ON CONFLICT (scope, key) DO NOTHING
            RETURNING true, r.id, r.fingerprint_version, r.fingerprint, r.state, r.lock_token,
                      r.lease_end, r.response_status, r.response_headers, r.response_body,
                      r.response_not_stored, r.recovery_point, r.created_at, r.expires_at, t;
        IF FOUND THEN
            RETURN;
        END IF;
    END LOOP;
END
$$;
