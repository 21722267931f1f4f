-- Deletes at most ?2 rows that expired by ?1 (unix ms), oldest first.
DELETE FROM {{table}}
WHERE rowid IN (
    SELECT rowid FROM {{table}}
    WHERE expires_at <= ?1
    ORDER BY expires_at
    LIMIT ?2
)
