-- The policy unknown (SPEC §13): a record completed by a claim that found its holder's
-- lease lapsed, under that policy, answers outcome_unknown (status 500, no body) until
-- an operator resolves it. Its state is 'completed'; this flag says why.
ALTER TABLE {{schema}}idem_records
    ADD COLUMN outcome_unknown boolean NOT NULL DEFAULT false;

-- idem_claim (0004) returns the new column, in the order scanRecord reads it.
DROP FUNCTION {{schema}}idem_claim(bytea, bytea, text, integer, bytea, text, bigint, bigint, timestamptz, boolean);

CREATE FUNCTION {{schema}}idem_claim(
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
                   r.response_not_stored, r.outcome_unknown, r.recovery_point, r.steps, r.operation, r.created_at,
                   r.expires_at, t
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
                      r.response_not_stored, r.outcome_unknown, r.recovery_point, r.steps, r.operation, r.created_at,
                   r.expires_at, t;
        IF FOUND THEN
            RETURN;
        END IF;
    END LOOP;
END
$$;
