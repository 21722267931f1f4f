-- Statements of the operator's interface (admin.Store, used by `idem keys`), in the
-- format of records.sql. None of them runs on the request path.

-- name: RecordInspect
-- One record by primary key, in any state, expired or not; the columns of records.sql.
-- $1 scope, $2 key, $3 injected now.
WITH clock AS MATERIALIZED (
    SELECT coalesce($3::timestamptz, clock_timestamp()) AS now
)
SELECT r.id, r.fingerprint_version, r.fingerprint, r.state, r.lock_token, r.lease_end,
       r.response_status, r.response_headers, r.response_body, r.response_not_stored,
       r.outcome_unknown, r.recovery_point, r.steps, r.operation, r.created_at, r.expires_at, clock.now
FROM {{schema}}idem_records r, clock
WHERE r.scope = $1 AND r.key = $2;

-- name: RecordListScope
-- One page of a scope's records in key order, after key $2, along the primary key;
-- the body's length, never the body. $1 scope, $2 after key, $3 state ('' = any),
-- $4 limit, $5 injected now, $6 outcome unknown only.
WITH clock AS MATERIALIZED (
    SELECT coalesce($5::timestamptz, clock_timestamp()) AS now
)
SELECT r.scope, r.key, r.id, r.fingerprint_version, r.fingerprint, r.state, r.lease_end,
       r.response_status, coalesce(octet_length(r.response_body), 0), r.response_not_stored,
       coalesce(r.recovery_point, ''), r.created_at, r.expires_at, r.outcome_unknown, clock.now
FROM {{schema}}idem_records r, clock
WHERE r.scope = $1 AND r.key > $2 AND ($3 = '' OR r.state = $3) AND (NOT $6 OR r.outcome_unknown)
ORDER BY r.key
LIMIT $4;

-- name: RecordListAll
-- One page of every scope's records in (scope, key) order, after ($1, $2).
-- $1 after scope, $2 after key, $3 state ('' = any), $4 limit, $5 injected now,
-- $6 outcome unknown only.
WITH clock AS MATERIALIZED (
    SELECT coalesce($5::timestamptz, clock_timestamp()) AS now
)
SELECT r.scope, r.key, r.id, r.fingerprint_version, r.fingerprint, r.state, r.lease_end,
       r.response_status, coalesce(octet_length(r.response_body), 0), r.response_not_stored,
       coalesce(r.recovery_point, ''), r.created_at, r.expires_at, r.outcome_unknown, clock.now
FROM {{schema}}idem_records r, clock
WHERE (r.scope, r.key) > ($1, $2) AND ($3 = '' OR r.state = $3) AND (NOT $6 OR r.outcome_unknown)
ORDER BY r.scope, r.key
LIMIT $4;

-- name: RecordDelete
-- Deletes one record unless, without $3 (force), it is in flight under a live lease.
-- The row is locked before the lease is judged, so a renewal cannot slip in between.
-- Answers (found, deleted): (0, 0) absent, (1, 0) kept under a live lease, (1, 1) gone.
-- $1 scope, $2 key, $3 force, $4 injected now.
WITH clock AS MATERIALIZED (
    SELECT coalesce($4::timestamptz, clock_timestamp()) AS now
), target AS (
    SELECT r.scope, r.key, (r.state = 'in_flight' AND r.lease_end > clock.now) AS live
    FROM {{schema}}idem_records r, clock
    WHERE r.scope = $1 AND r.key = $2
    FOR UPDATE OF r
), gone AS (
    DELETE FROM {{schema}}idem_records AS r
    USING target
    WHERE r.scope = target.scope AND r.key = target.key AND ($3 OR NOT target.live)
    RETURNING 1
)
SELECT (SELECT count(*) FROM target), (SELECT count(*) FROM gone);

-- name: RecordDeleteScope
-- Deletes one batch of a scope's records, along the primary key, sparing (without $2,
-- force) those in flight under a live lease. It waits for rows that requests hold
-- locked rather than skipping them, so that a batch short of the limit means the
-- scope is done. $1 scope, $2 force, $3 limit, $4 injected now.
WITH clock AS MATERIALIZED (
    SELECT coalesce($4::timestamptz, clock_timestamp()) AS now
), doomed AS (
    SELECT r.scope, r.key
    FROM {{schema}}idem_records r, clock
    WHERE r.scope = $1 AND ($2 OR NOT (r.state = 'in_flight' AND r.lease_end > clock.now))
    LIMIT $3
    FOR UPDATE OF r
)
DELETE FROM {{schema}}idem_records AS r
USING doomed, clock
WHERE r.scope = doomed.scope AND r.key = doomed.key
  AND ($2 OR NOT (r.state = 'in_flight' AND r.lease_end > clock.now));

-- name: RecordCountLive
-- The number of a scope's records in flight under a live lease.
-- $1 scope, $2 injected now.
WITH clock AS MATERIALIZED (
    SELECT coalesce($2::timestamptz, clock_timestamp()) AS now
)
SELECT count(*)
FROM {{schema}}idem_records r, clock
WHERE r.scope = $1 AND r.state = 'in_flight' AND r.lease_end > clock.now;

-- name: RecordResolveRelease
-- Releases a key whose outcome is unknown (admin.Store.RecordResolve): deletes its
-- record, which must be completed as outcome unknown and not expired.
-- $1 scope, $2 key, $3 injected now.
WITH clock AS MATERIALIZED (
    SELECT coalesce($3::timestamptz, clock_timestamp()) AS now
)
DELETE FROM {{schema}}idem_records AS r
USING clock
WHERE r.scope = $1 AND r.key = $2 AND r.outcome_unknown AND r.expires_at > clock.now;

-- name: RecordResolveComplete
-- Completes a key whose outcome is unknown with the operator's response
-- (admin.Store.RecordResolve); the record must be completed as outcome unknown and not
-- expired. Its expiry stays. $1 scope, $2 key, $3 injected now, $4 status, $5 headers
-- (headers.go encoding), $6 body.
WITH clock AS MATERIALIZED (
    SELECT coalesce($3::timestamptz, clock_timestamp()) AS now
)
UPDATE {{schema}}idem_records AS r
SET response_status = $4,
    response_headers = $5,
    response_body = $6,
    response_not_stored = false,
    outcome_unknown = false
FROM clock
WHERE r.scope = $1 AND r.key = $2 AND r.outcome_unknown AND r.expires_at > clock.now;
