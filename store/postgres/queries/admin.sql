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
       coalesce(r.recovery_point, ''), r.created_at, r.expires_at, r.outcome_unknown, coalesce(r.operation, ''),
       clock.now
FROM {{schema}}idem_records r, clock
WHERE r.scope = $1 AND r.key > $2 AND ($3 = '' OR r.state = $3) AND (NOT $6 OR r.outcome_unknown)
ORDER BY r.key
LIMIT $4;

-- name: RecordListAll
-- One page of every scope's records in (scope, key) order, after ($1, $2), but idem's
-- own ($7, idemstore.ReservedScope), which a list of that scope shows.
-- $1 after scope, $2 after key, $3 state ('' = any), $4 limit, $5 injected now,
-- $6 outcome unknown only, $7 the reserved scope.
WITH clock AS MATERIALIZED (
    SELECT coalesce($5::timestamptz, clock_timestamp()) AS now
)
SELECT r.scope, r.key, r.id, r.fingerprint_version, r.fingerprint, r.state, r.lease_end,
       r.response_status, coalesce(octet_length(r.response_body), 0), r.response_not_stored,
       coalesce(r.recovery_point, ''), r.created_at, r.expires_at, r.outcome_unknown, coalesce(r.operation, ''),
       clock.now
FROM {{schema}}idem_records r, clock
WHERE (r.scope, r.key) > ($1, $2) AND ($3 = '' OR r.state = $3) AND (NOT $6 OR r.outcome_unknown)
  AND r.scope <> $7
ORDER BY r.scope, r.key
LIMIT $4;

-- name: RecordDelete
-- Deletes one record unless, without $3 (force), it is in flight under a live lease, or,
-- without $5 (abandon), it is an unfinished operation (in flight after a step
-- committed: SPEC §13). The row is locked before it is judged, so a renewal or a step
-- cannot slip in between. Answers (found, deleted, live, unfinished): (0, 0, …)
-- absent; (1, 0, live, unfinished) kept, and why; (1, 1, …) gone.
-- $1 scope, $2 key, $3 force, $4 injected now, $5 abandon.
WITH clock AS MATERIALIZED (
    SELECT coalesce($4::timestamptz, clock_timestamp()) AS now
), target AS (
    SELECT r.scope, r.key, (r.state = 'in_flight' AND r.lease_end > clock.now) AS live,
           (r.state = 'in_flight' AND r.recovery_point IS NOT NULL) AS unfinished
    FROM {{schema}}idem_records r, clock
    WHERE r.scope = $1 AND r.key = $2
    FOR UPDATE OF r
), gone AS (
    DELETE FROM {{schema}}idem_records AS r
    USING target
    WHERE r.scope = target.scope AND r.key = target.key AND ($3 OR NOT target.live)
      AND ($5 OR NOT target.unfinished)
    RETURNING 1
)
SELECT (SELECT count(*) FROM target), (SELECT count(*) FROM gone),
       coalesce((SELECT live FROM target), false), coalesce((SELECT unfinished FROM target), false);

-- name: RecordDeleteScope
-- Deletes one batch of a scope's records, along the primary key, sparing (without $2,
-- force) those in flight under a live lease and (without $5, abandon) unfinished
-- operations, in flight after a step committed (SPEC §13). It waits for rows that
-- requests hold locked rather than skipping them, so that a batch short of the limit
-- means the scope is done. $1 scope, $2 force, $3 limit, $4 injected now, $5 abandon.
WITH clock AS MATERIALIZED (
    SELECT coalesce($4::timestamptz, clock_timestamp()) AS now
), doomed AS (
    SELECT r.scope, r.key
    FROM {{schema}}idem_records r, clock
    WHERE r.scope = $1 AND ($2 OR NOT (r.state = 'in_flight' AND r.lease_end > clock.now))
      AND ($5 OR NOT (r.state = 'in_flight' AND r.recovery_point IS NOT NULL))
    LIMIT $3
    FOR UPDATE OF r
)
DELETE FROM {{schema}}idem_records AS r
USING doomed, clock
WHERE r.scope = doomed.scope AND r.key = doomed.key
  AND ($2 OR NOT (r.state = 'in_flight' AND r.lease_end > clock.now))
  AND ($5 OR NOT (r.state = 'in_flight' AND r.recovery_point IS NOT NULL));

-- name: RecordCountKept
-- What RecordDeleteScope kept of a scope: the unfinished operations unless $4
-- (abandon), and the other records in flight under a live lease unless $3 (force).
-- $1 scope, $2 injected now, $3 force, $4 abandon.
WITH clock AS MATERIALIZED (
    SELECT coalesce($2::timestamptz, clock_timestamp()) AS now
)
SELECT count(*) FILTER (WHERE r.recovery_point IS NOT NULL AND NOT $4),
       count(*) FILTER (WHERE r.lease_end > clock.now AND NOT $3 AND NOT (r.recovery_point IS NOT NULL AND NOT $4))
FROM {{schema}}idem_records r, clock
WHERE r.scope = $1 AND r.state = 'in_flight';

-- name: RecordResolveRelease
-- Releases a key whose outcome is unknown or whose operation is unfinished
-- (admin.Store.RecordResolve): deletes its record, which must be completed as outcome
-- unknown and not expired, or in flight after a step committed (SPEC §13) with its
-- lease lapsed or ended. $1 scope, $2 key, $3 injected now.
WITH clock AS MATERIALIZED (
    SELECT coalesce($3::timestamptz, clock_timestamp()) AS now
)
DELETE FROM {{schema}}idem_records AS r
USING clock
WHERE r.scope = $1 AND r.key = $2
  AND ((r.outcome_unknown AND r.expires_at > clock.now)
       OR (r.state = 'in_flight' AND r.recovery_point IS NOT NULL AND r.lease_end <= clock.now))
  AND {{durable}};

-- name: RecordResolveComplete
-- Completes a key whose outcome is unknown, or whose operation is unfinished, with the
-- operator's response (admin.Store.RecordResolve); the record must be as
-- RecordResolveRelease says. An outcome-unknown record keeps its expiry; an unfinished
-- one expires its TTL (expires_at − created_at) after now. $1 scope, $2 key, $3 injected
-- now, $4 status, $5 headers (headers.go encoding), $6 body.
WITH clock AS MATERIALIZED (
    SELECT coalesce($3::timestamptz, clock_timestamp()) AS now
)
UPDATE {{schema}}idem_records AS r
SET state = 'completed',
    lock_token = NULL,
    lease_end = NULL,
    response_status = $4,
    response_headers = $5,
    response_body = $6,
    response_not_stored = false,
    outcome_unknown = false,
    recovery_point = NULL,
    expires_at = CASE WHEN r.state = 'in_flight' THEN clock.now + (r.expires_at - r.created_at) ELSE r.expires_at END
FROM clock
WHERE r.scope = $1 AND r.key = $2
  AND ((r.outcome_unknown AND r.expires_at > clock.now)
       OR (r.state = 'in_flight' AND r.recovery_point IS NOT NULL AND r.lease_end <= clock.now))
  AND {{durable}};

-- name: RecordListUnfinished
-- One page of the unfinished operations (SPEC §13: in flight, recovery point advanced)
-- in (scope, key) order after ($1, $2), of scope $3 only unless it is NULL, along the
-- partial index idem_records_unfinished_idx (0008); the columns of RecordListAll.
-- $1 after scope, $2 after key, $3 scope (NULL: every scope), $4 limit, $5 injected now.
WITH clock AS MATERIALIZED (
    SELECT coalesce($5::timestamptz, clock_timestamp()) AS now
)
SELECT r.scope, r.key, r.id, r.fingerprint_version, r.fingerprint, r.state, r.lease_end,
       r.response_status, coalesce(octet_length(r.response_body), 0), r.response_not_stored,
       coalesce(r.recovery_point, ''), r.created_at, r.expires_at, r.outcome_unknown, coalesce(r.operation, ''),
       clock.now
FROM {{schema}}idem_records r, clock
WHERE r.state = 'in_flight' AND r.recovery_point IS NOT NULL
  AND (r.scope, r.key) > ($1, $2) AND ($3::bytea IS NULL OR r.scope = $3)
ORDER BY r.scope, r.key
LIMIT $4;

-- name: RecordReseal
-- Replaces a record's sealed response body ($5) and step results ($7) in place
-- (admin.Resealer.RecordReseal): each only when given (not NULL), and only while the
-- record has id $3 and still holds the old value ($4, $6): a compare-and-swap. No row:
-- it changed, or is gone. $1 scope, $2 key.
UPDATE {{schema}}idem_records AS r
SET response_body = coalesce($5::bytea, r.response_body),
    steps = coalesce($7::bytea, r.steps)
WHERE r.scope = $1 AND r.key = $2 AND r.id = $3
  AND ($5::bytea IS NULL OR r.response_body = $4::bytea)
  AND ($7::bytea IS NULL OR r.steps = $6::bytea)
  AND {{durable}};
