-- Deletes at most $2 rows that expired by $1 (unix ms), oldest first, skipping rows
-- that transactions hold.
DELETE FROM {{table}}
WHERE (scope, idempotency_key) IN (
    SELECT scope, idempotency_key FROM {{table}}
    WHERE expires_at <= $1
    ORDER BY expires_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
