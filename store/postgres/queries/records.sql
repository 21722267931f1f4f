-- Statements of the PostgreSQL store. Each starts with a "-- name:" line; queries.go
-- loads them and replaces {{schema}} with the configured schema (quoted, with a dot) or
-- with nothing (the search_path). Every time-dependent statement reads the store's clock
-- as coalesce(<now>::timestamptz, clock_timestamp()): the injected time of a test, or
-- PostgreSQL's own wall clock (clock_timestamp, not now(), so that a statement retried
-- inside a long transaction still sees the current time; RecordClaimNew, alone in its
-- implicit transaction, reads the start of its statement). Durations travel as
-- microseconds (bigint). Every row-returning record statement lists the columns in the
-- order that scanRecord reads them.
--
-- Every statement that writes a record holds {{durable}} (queries.go fills it in): a
-- condition, always true, that raises the transaction's synchronous_commit from off or
-- local to on (set_config(…, true) is SET LOCAL), and keeps any stronger setting
-- (on, remote_write, remote_apply), so that the record commits durably whatever the
-- role's or the session's setting (a claim with Config.AsynchronousClaim excepted). It
-- sits in the WHERE clause of the write, evaluated for each row the write finds, before
-- the commit that reads the setting. A store whose sessions are at on or stronger
-- already sends the same statements with {{durable}} true (durability.go): there the
-- raise would change nothing, and set_config is not free.

-- name: RecordClaim
-- One round trip for every outcome but the rare takeover. A key that is there (a replay,
-- a duplicate, a reused key: most claims of a key after its first) is one read by the
-- primary key in plain SQL, as cheap as any read of a row by its key; only when the read
-- finds nothing does idem_claim_v3 (migration 0009) run, which inserts the in-flight
-- record with a plain INSERT (no speculative insertion: no HEAP_CONFIRM in the WAL). A
-- record of the key that a concurrent claim committed after this statement's snapshot
-- fails that insert with unique_violation (23505): the caller runs the claim again,
-- whose read finds it. The two branches share the statement's snapshot, so exactly one
-- of them answers. The columns are named, not *, so that the function may gain
-- columns without changing this statement's result. (idem_claim_v2, which v3 follows,
-- stays for the processes of the previous version.)
-- When $10 is true the statement's own (implicit) transaction commits without waiting
-- for the WAL flush (SET LOCAL synchronous_commit inside idem_claim_v3, and
-- {{durable_claim}} keeps it off). Why losing such a claim in a crash is safe: doc.go,
-- "Durable claims". Otherwise {{durable_claim}} is {{durable}}, evaluated on the row the
-- function inserted.
-- $1 scope, $2 key, $3 record id, $4 fingerprint version, $5 fingerprint, $6 token,
-- $7 lease (µs), $8 ttl (µs), $9 injected now (NULL: the store's clock), $10 async commit.
SELECT false, r.id, r.fingerprint_version, r.fingerprint, r.state, r.lock_token, r.lease_end,
       r.response_status, r.response_headers, r.response_body, r.response_not_stored,
       r.outcome_unknown, r.recovery_point, r.steps, r.operation, r.created_at, r.expires_at,
       coalesce($9::timestamptz, clock_timestamp())
FROM {{schema}}idem_records r
WHERE r.scope = $1 AND r.key = $2
UNION ALL
SELECT claimed, id, fingerprint_version, fingerprint, state, lock_token, lease_end,
       response_status, response_headers, response_body, response_not_stored, outcome_unknown,
       recovery_point, steps, operation, created_at, expires_at, now
FROM {{schema}}idem_claim_v3($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
WHERE NOT EXISTS (SELECT 1 FROM {{schema}}idem_records WHERE scope = $1 AND key = $2)
  AND {{durable_claim}};

-- name: RecordClaimNew
-- RecordClaim for a key the caller expects to be new (idemstore.ClaimParams.LikelyNew:
-- the route's requests seldom find their key recorded, or a read of the key just found
-- nothing): a plain INSERT of the in-flight record, which answers only the store's
-- time, where RecordClaim reads the key twice, calls idem_claim_v3 and returns the
-- whole record (issue 41: what a new key costs PostgreSQL). The caller knows every
-- other column: it sent them. A key that is there after all (a retry, a duplicate, an
-- expired record) fails the insert with unique_violation (23505), after waiting for a
-- concurrent claim's transaction to end; the caller then runs RecordClaim, which
-- reads it. The statement runs in its own implicit transaction, so the failed insert
-- leaves nothing behind but a dead row version. Its store's clock is
-- statement_timestamp(), the start of this statement (stable, where clock_timestamp()
-- is volatile: the planner folds the clock's subquery into the insert, issue 50); the
-- lease and the TTL then count from a moment before the insert, never after it.
-- $1 scope, $2 key, $3 record id, $4 fingerprint version, $5 fingerprint, $6 token,
-- $7 lease (µs), $8 ttl (µs), $9 injected now (NULL: the store's clock), $10 async commit.
INSERT INTO {{schema}}idem_records
    (scope, key, id, fingerprint_version, fingerprint, state, lock_token, lease_end,
     created_at, expires_at)
SELECT $1::bytea, $2::bytea, $3::text, $4::integer, $5::bytea, 'in_flight', $6::text,
       clock.now + $7::bigint * interval '1 microsecond',
       clock.now,
       greatest(clock.now + $8::bigint * interval '1 microsecond',
                clock.now + $7::bigint * interval '1 microsecond')
FROM (SELECT coalesce($9::timestamptz, statement_timestamp()) AS now) AS clock
WHERE {{durable_claim}}
RETURNING created_at;

-- name: RecordClaimExpired
-- Claims an expired record afresh (SPEC §5.1, §8): new id, created_at, fingerprint,
-- token and lease; the old response is dropped. The WHERE re-checks expiry with the
-- store's clock, so of concurrent claimers that all saw the expired record exactly one
-- updates it (the others re-evaluate the WHERE on the new row version and match nothing).
-- An unfinished operation (in flight, its recovery point advanced) never expires (SPEC
-- §13): a step that committed after the claim's read makes this match nothing.
-- $1 scope, $2 key, $3 record id, $4 fingerprint version, $5 fingerprint, $6 token,
-- $7 lease (µs), $8 ttl (µs), $9 injected now.
WITH clock AS MATERIALIZED (
    SELECT coalesce($9::timestamptz, clock_timestamp()) AS now
)
UPDATE {{schema}}idem_records AS r
SET id = $3,
    fingerprint_version = $4,
    fingerprint = $5,
    state = 'in_flight',
    lock_token = $6,
    lease_end = clock.now + $7::bigint * interval '1 microsecond',
    created_at = clock.now,
    expires_at = greatest(clock.now + $8::bigint * interval '1 microsecond',
                          clock.now + $7::bigint * interval '1 microsecond'),
    response_status = NULL,
    response_headers = NULL,
    response_body = NULL,
    response_not_stored = false,
    outcome_unknown = false,
    recovery_point = NULL,
    steps = NULL,
    operation = NULL
FROM clock
WHERE r.scope = $1 AND r.key = $2 AND r.expires_at <= clock.now
  AND NOT (r.state = 'in_flight' AND r.recovery_point IS NOT NULL)
  AND {{durable}}
RETURNING r.id, r.fingerprint_version, r.fingerprint, r.state, r.lock_token, r.lease_end,
          r.response_status, r.response_headers, r.response_body, r.response_not_stored,
          r.outcome_unknown, r.recovery_point, r.steps, r.operation, r.created_at, r.expires_at, clock.now;

-- name: RecordTakeOver
-- Takes over an in-flight record whose lease lapsed (SPEC §5.3), keeping its id and
-- created_at. Fenced by the old token and a re-check of the lease with the store's clock:
-- a holder that renewed in time, or another taker that won, leaves nothing to update.
-- The record must not be expired, unless it is an unfinished operation (its recovery
-- point advanced), which never expires (SPEC §13).
-- $1 scope, $2 key, $3 old token, $4 new token, $5 lease (µs), $6 ttl (µs), $7 injected now.
WITH clock AS MATERIALIZED (
    SELECT coalesce($7::timestamptz, clock_timestamp()) AS now
)
UPDATE {{schema}}idem_records AS r
SET lock_token = $4,
    lease_end = clock.now + $5::bigint * interval '1 microsecond',
    expires_at = greatest(r.created_at + $6::bigint * interval '1 microsecond',
                          clock.now + $5::bigint * interval '1 microsecond')
FROM clock
WHERE r.scope = $1 AND r.key = $2
  AND r.state = 'in_flight' AND r.lock_token = $3
  AND r.lease_end <= clock.now AND (r.expires_at > clock.now OR r.recovery_point IS NOT NULL)
  AND {{durable}}
RETURNING r.id, r.fingerprint_version, r.fingerprint, r.state, r.lock_token, r.lease_end,
          r.response_status, r.response_headers, r.response_body, r.response_not_stored,
          r.outcome_unknown, r.recovery_point, r.steps, r.operation, r.created_at, r.expires_at, clock.now;

-- name: RecordMarkUnknown
-- Completes an in-flight record whose holder's lease lapsed as outcome unknown
-- (idem.DecideUnknown, SPEC §13), instead of taking it over: every retry gets 500
-- outcome_unknown until an operator resolves it. Fenced as RecordTakeOver is, by the
-- old token and a re-check of the lease with the store's clock. It expires at
-- created_at + ttl, or, for an unfinished operation, a ttl after now (SPEC §13).
-- $1 scope, $2 key, $3 old token, $4 ttl (µs), $5 injected now.
WITH clock AS MATERIALIZED (
    SELECT coalesce($5::timestamptz, clock_timestamp()) AS now
)
UPDATE {{schema}}idem_records AS r
SET state = 'completed',
    lock_token = NULL,
    lease_end = NULL,
    response_status = 500,
    response_headers = NULL,
    response_body = NULL,
    response_not_stored = false,
    outcome_unknown = true,
    expires_at = CASE WHEN r.recovery_point IS NULL
                      THEN r.created_at + $4::bigint * interval '1 microsecond'
                      ELSE greatest(r.created_at, clock.now) + $4::bigint * interval '1 microsecond' END
FROM clock
WHERE r.scope = $1 AND r.key = $2
  AND r.state = 'in_flight' AND r.lock_token = $3
  AND r.lease_end <= clock.now AND (r.expires_at > clock.now OR r.recovery_point IS NOT NULL)
  AND {{durable}}
RETURNING r.id, r.fingerprint_version, r.fingerprint, r.state, r.lock_token, r.lease_end,
          r.response_status, r.response_headers, r.response_body, r.response_not_stored,
          r.outcome_unknown, r.recovery_point, r.steps, r.operation, r.created_at, r.expires_at,
          clock.now;

-- name: RecordComplete
-- Stores the final response, fenced by the token and the in-flight state (SPEC §5).
-- A lapsed lease that nobody took over still counts as held. No rows: lease lost. The
-- record expires at created_at + ttl, or, when its recovery point advanced, a ttl
-- after the completion (SPEC §13: an operation that outlived its TTL unfinished keeps
-- its result a whole TTL).
-- The update is heap-only (HOT) for a record without steps: it changes no indexed
-- column (expires_at is the claim's created_at + ttl again, and the partial index of
-- unfinished operations reads recovery_point only, NULL before and after), so it
-- writes the row's new version beside the old one and no index entry (migration 0008).
-- A record whose recovery point advanced leaves that index: the recovery point says
-- where an unfinished operation stands, and is cleared once it completed (its steps'
-- results stay).
-- $1 scope, $2 key, $3 token, $4 status, $5 headers (headers.go encoding), $6 body, $7 not stored,
-- $8 ttl (µs), $9 injected now.
UPDATE {{schema}}idem_records
SET state = 'completed',
    lock_token = NULL,
    lease_end = NULL,
    response_status = $4,
    response_headers = $5,
    response_body = $6,
    response_not_stored = $7,
    recovery_point = NULL,
    expires_at = CASE WHEN recovery_point IS NULL THEN created_at
                      ELSE greatest(created_at, coalesce($9::timestamptz, clock_timestamp())) END
                 + $8::bigint * interval '1 microsecond'
WHERE scope = $1 AND key = $2 AND lock_token = $3 AND state = 'in_flight' AND {{durable}};

-- name: RecordCompleteTx
-- RecordComplete inside the application's transaction (SPEC §7): the same fenced
-- update, but a lost lease raises IDL01 (idem_fence), aborting the transaction so that a
-- COMMIT pipelined behind this statement cannot commit the application's writes. Its
-- expiry, its recovery point and its HOT update are RecordComplete's. The CASE calls
-- idem_fence only when the update found nothing: a completion that holds its lease
-- (nearly all of them) pays for no PL/pgSQL call (issue 50).
-- $1 scope, $2 key, $3 token, $4 status, $5 headers, $6 body, $7 not stored, $8 ttl (µs),
-- $9 injected now.
WITH done AS (
    UPDATE {{schema}}idem_records
    SET state = 'completed',
        lock_token = NULL,
        lease_end = NULL,
        response_status = $4,
        response_headers = $5,
        response_body = $6,
        response_not_stored = $7,
        recovery_point = NULL,
        expires_at = CASE WHEN recovery_point IS NULL THEN created_at
                          ELSE greatest(created_at, coalesce($9::timestamptz, clock_timestamp())) END
                     + $8::bigint * interval '1 microsecond'
    WHERE scope = $1 AND key = $2 AND lock_token = $3 AND state = 'in_flight' AND {{durable}}
    RETURNING 1
)
SELECT CASE WHEN EXISTS (SELECT 1 FROM done) THEN true ELSE {{schema}}idem_fence(false) END;

-- name: RecordRelease
-- Deletes the holder's in-flight record so that a retry executes afresh (SPEC §6), or,
-- when its recovery point advanced, keeps it with no holder and its lease ended now, so
-- that a retry or the completer resumes it at once: its committed steps must not run
-- again (SPEC §13). Both are fenced by the token; at most one matches. Answers how
-- many records it released (0: lease lost).
-- $1 scope, $2 key, $3 token, $4 injected now.
WITH clock AS MATERIALIZED (
    SELECT coalesce($4::timestamptz, clock_timestamp()) AS now
), deleted AS (
    DELETE FROM {{schema}}idem_records
    WHERE scope = $1 AND key = $2 AND lock_token = $3 AND state = 'in_flight'
      AND recovery_point IS NULL AND {{durable}}
    RETURNING 1
), kept AS (
    UPDATE {{schema}}idem_records AS r
    SET lock_token = '',
        lease_end = clock.now
    FROM clock
    WHERE r.scope = $1 AND r.key = $2 AND r.lock_token = $3 AND r.state = 'in_flight'
      AND r.recovery_point IS NOT NULL AND {{durable}}
    RETURNING 1
)
SELECT (SELECT count(*) FROM deleted) + (SELECT count(*) FROM kept);

-- name: RecordStep
-- Commits one step of the holder's operation (SPEC §13): the new recovery point, the
-- saved results and the operation's name; fenced by the token and the in-flight state.
-- No rows: lease lost. $1 scope, $2 key, $3 token, $4 recovery point, $5 steps,
-- $6 operation.
UPDATE {{schema}}idem_records
SET recovery_point = $4,
    steps = $5,
    operation = $6
WHERE scope = $1 AND key = $2 AND lock_token = $3 AND state = 'in_flight' AND {{durable}};

-- name: RecordStepTx
-- RecordStep inside the application's transaction: a lost lease raises IDL01
-- (idem_fence, called only then, as in RecordCompleteTx), aborting the transaction, so
-- that a COMMIT pipelined behind this statement cannot commit the step's writes. $1–$6
-- as RecordStep.
WITH done AS (
    UPDATE {{schema}}idem_records
    SET recovery_point = $4,
        steps = $5,
        operation = $6
    WHERE scope = $1 AND key = $2 AND lock_token = $3 AND state = 'in_flight' AND {{durable}}
    RETURNING 1
)
SELECT CASE WHEN EXISTS (SELECT 1 FROM done) THEN true ELSE {{schema}}idem_fence(false) END;

-- name: RecordListResumable
-- One batch of the records the completer may resume (SPEC §13): in flight, recovery
-- point advanced, lease lapsed or ended, however long ago their TTL ran out (an
-- unfinished operation never expires); in (scope, key) order after the cursor, along
-- the partial index idem_records_unfinished_idx (0008). No response columns.
-- $1 after scope, $2 after key, $3 limit, $4 injected now.
WITH clock AS MATERIALIZED (
    SELECT coalesce($4::timestamptz, clock_timestamp()) AS now
)
SELECT r.scope, r.key, r.id, r.fingerprint_version, r.fingerprint, r.state, r.lock_token,
       r.lease_end, NULL::integer, NULL::bytea, NULL::bytea, false, false,
       r.recovery_point, r.steps, r.operation, r.created_at, r.expires_at, clock.now
FROM {{schema}}idem_records r, clock
WHERE r.state = 'in_flight' AND r.recovery_point IS NOT NULL
  AND r.lease_end <= clock.now
  AND (r.scope, r.key) > ($1, $2)
ORDER BY r.scope, r.key
LIMIT $3;

-- name: RecordRenew
-- Extends the holder's lease to now + lease, keeping expires_at = max(created_at + ttl,
-- lease_end) (SPEC §8). $1 scope, $2 key, $3 token, $4 lease (µs), $5 ttl (µs),
-- $6 injected now.
WITH clock AS MATERIALIZED (
    SELECT coalesce($6::timestamptz, clock_timestamp()) AS now
)
UPDATE {{schema}}idem_records AS r
SET lease_end = clock.now + $4::bigint * interval '1 microsecond',
    expires_at = greatest(r.created_at + $5::bigint * interval '1 microsecond',
                          clock.now + $4::bigint * interval '1 microsecond')
FROM clock
WHERE r.scope = $1 AND r.key = $2 AND r.lock_token = $3 AND r.state = 'in_flight' AND {{durable}}
RETURNING r.lease_end;

-- name: RecordGet
-- One record by primary key, with the store's time: a plain read, as cheap as any read
-- of a row by its key (it answers a ClaimInHandler route's retries, and the polls of a
-- wait). Whether it expired (SPEC §8; an unfinished operation never does, SPEC §13) is
-- decided from the returned time (idem.Record.Expired), at the store's edge.
-- $1 scope, $2 key, $3 injected now.
SELECT r.id, r.fingerprint_version, r.fingerprint, r.state, r.lock_token, r.lease_end,
       r.response_status, r.response_headers, r.response_body, r.response_not_stored,
       r.outcome_unknown, r.recovery_point, r.steps, r.operation, r.created_at, r.expires_at,
       coalesce($3::timestamptz, clock_timestamp())
FROM {{schema}}idem_records r
WHERE r.scope = $1 AND r.key = $2;

-- name: RecordDeleteExpired
-- One step of the cleaner's walk of the table (SPEC §8): deletes the records of pages
-- [$1, $2) that expired more than the retention ago, at most $5 of them, never an
-- in-flight record whose lease is live nor an unfinished operation's (in flight, its
-- recovery point advanced: SPEC §13). The table keeps no index of expiry (migration
-- 0010: a new key's claim writes one index entry fewer); the cleaner walks its pages
-- in disk order instead, a range at a time, each read by a TID range scan. SKIP LOCKED
-- keeps the cleaner out of the way of requests (and of other cleaners); the DELETE
-- re-checks the condition on the rows it locked. Answers how many it deleted, the
-- page of the last row it locked (NULL when none: where the next step starts when
-- this one stopped at its limit), and the table's pages now.
-- $1 first page, $2 page after the last, $3 retention (µs), $4 injected now, $5 limit,
-- $6 the table's name (with its quoted schema).
WITH clock AS MATERIALIZED (
    SELECT coalesce($4::timestamptz, clock_timestamp()) AS now
), doomed AS (
    SELECT r.ctid
    FROM {{schema}}idem_records r, clock
    WHERE r.ctid >= format('(%s,0)', $1::bigint)::tid
      AND r.ctid < format('(%s,0)', $2::bigint)::tid
      AND r.expires_at < clock.now - $3::bigint * interval '1 microsecond'
      AND NOT (r.state = 'in_flight' AND (r.lease_end > clock.now OR r.recovery_point IS NOT NULL))
    LIMIT $5
    FOR UPDATE OF r SKIP LOCKED
), deleted AS (
    DELETE FROM {{schema}}idem_records AS r
    USING clock
    WHERE r.ctid = ANY (ARRAY(SELECT ctid FROM doomed))
      AND r.expires_at < clock.now - $3::bigint * interval '1 microsecond'
      AND NOT (r.state = 'in_flight' AND (r.lease_end > clock.now OR r.recovery_point IS NOT NULL))
    RETURNING 1
)
SELECT (SELECT count(*) FROM deleted),
       (SELECT max((ctid::text::point)[0])::bigint FROM doomed),
       pg_relation_size($6::text::regclass) / current_setting('block_size')::bigint;

-- name: RecordCountUnfinished
-- The unfinished operations (SPEC §13: in flight, recovery point advanced, lease live or
-- not) and the oldest one's creation, along the partial index idem_records_unfinished_idx (0008),
-- with the store's time. $1 injected now.
SELECT count(*), min(r.created_at), coalesce($1::timestamptz, clock_timestamp())
FROM {{schema}}idem_records r
WHERE r.state = 'in_flight' AND r.recovery_point IS NOT NULL;

-- name: RecordInsertCompleted
-- The claim and the completion of a ClaimInHandler transaction (Respond), its first
-- statement: when the key has no record, it inserts the record already completed, in
-- the transaction that holds the application's writes, so that it needs no lease,
-- token or heartbeat (the open transaction is the lock), and returns one row. When a
-- record of the key is there (live or expired: a retry the middleware did not read
-- first, a duplicate recorded since its read) it takes no lock, writes nothing and
-- raises IDL02 (idem_stop, migration 0007), which aborts the transaction before the
-- application's statements run, and the caller claims the key the usual way; a record
-- that a concurrent claim committed after this statement's snapshot fails the insert
-- with unique_violation (23505), with the same outcome. A concurrent claim of the same
-- key in flight holds the key's advisory lock ($13, transaction-scoped, taken here
-- before the insert): this one waits for it at most the lock_timeout set for that wait
-- ($12), then fails with lock_not_available (55P03: 409 request_in_progress). Only that
-- wait is so short: the insert's own lock waits (the relation's extension lock, which a
-- database busy with I/O can hold past 100 ms; a row of the key that another route's
-- transaction updates) get the longer bound $14, so that a fresh key is not answered
-- 409 because the disk was slow; and the application's statements after it wait for
-- their locks as they would without idem, under the session's lock_timeout, which the
-- final SELECT puts back once the insert returned its row. Only a claim that found no
-- record takes the key's lock, so that concurrent retries of a key never wait for each
-- other. The materialised CTEs run their expressions in order before the insert can
-- wait (keylock, a row only when found is empty, keeps the session's lock_timeout, sets
-- the key's bound, takes the key's lock and sets the insert's bound), and a lock wait
-- reads lock_timeout when it begins.
-- $1 scope, $2 key, $3 record id, $4 fingerprint version, $5 fingerprint, $6 status,
-- $7 headers, $8 body, $9 not stored, $10 ttl (µs), $11 injected now, $12 the key's lock
-- timeout, $13 the key's advisory lock id, $14 the insert's lock timeout.
WITH found AS MATERIALIZED (
    SELECT 1 FROM {{schema}}idem_records r WHERE r.scope = $1 AND r.key = $2
), keylock AS MATERIALIZED (
    SELECT set_config('idem.lock_timeout', current_setting('lock_timeout'), true) AS kept,
           set_config('lock_timeout', $12, true) AS key_wait,
           pg_advisory_xact_lock(1768189233, $13::int4)::text AS key_lock,
           set_config('lock_timeout', $14, true) AS insert_wait,
           coalesce($11::timestamptz, clock_timestamp()) AS now
    WHERE NOT EXISTS (SELECT 1 FROM found) AND {{durable}}
), inserted AS (
    INSERT INTO {{schema}}idem_records
        (scope, key, id, fingerprint_version, fingerprint, state, response_status,
         response_headers, response_body, response_not_stored, created_at, expires_at)
    SELECT $1, $2, $3, $4, $5, 'completed', $6, $7, $8, $9, k.now,
           k.now + $10::bigint * interval '1 microsecond'
    FROM keylock k
    RETURNING 1
)
SELECT set_config('lock_timeout', current_setting('idem.lock_timeout'), true)
FROM inserted
UNION ALL
SELECT {{schema}}idem_stop(true)::text
FROM found;
