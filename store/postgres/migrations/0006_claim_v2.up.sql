-- Rolling upgrades. While a deploy replaces processes one by one, processes of the
-- previous version run beside a schema that a new one has migrated, so a migration only
-- adds: tables, columns with defaults (or NULL), indexes, and functions under new names.
-- It never changes what an existing function returns, since a process of the previous
-- version reads it: migrations 0004 and 0005 redefined idem_claim in place (two more
-- columns), and a process built before either claimed no key beside a migrated schema
-- (503) until it was replaced.
--
-- idem_claim keeps the shape of 0005, the one that processes up to this migration read
-- with SELECT *, and keeps working on the table as later migrations extend it. The
-- store now calls idem_claim_v2, naming the columns it reads, so that its result may
-- gain columns later without breaking a cached plan; a change to what a claim does or
-- returns adds idem_claim_v3, and a migration drops an old version only once no process
-- that calls it can still run (say, a release later, in the CHANGELOG).
--
-- idem_claim_v2 is idem_claim of 0005, under its own name. store/postgres's
-- upgrade_test.go runs the previous version's claim beside the current one.
CREATE FUNCTION {{schema}}idem_claim_v2(
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
                   r.response_not_stored, r.outcome_unknown, r.recovery_point, r.steps, r.operation,
                   r.created_at, r.expires_at, t
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
                      r.response_not_stored, r.outcome_unknown, r.recovery_point, r.steps, r.operation,
                      r.created_at, r.expires_at, t;
        IF FOUND THEN
            RETURN;
        END IF;
    END LOOP;
END
$$;
