-- A lean record (issue 41): no index of expiry. idem_records_expires_at_idx (0001) cost
-- every new key one index entry and one WAL record more than its claim needs; only the
-- cleaner read it. The cleaner now walks the table's pages in disk order instead, a
-- range at a time (RecordDeleteExpired in queries/records.sql), each range read by a
-- TID range scan and deleted in a short transaction of its own.
--
-- Dropping an index rewrites nothing: the table stays online. DROP INDEX takes the
-- table's ACCESS EXCLUSIVE lock for the moment of the catalog change, which waits for
-- the statements running on the table, and which the statements that come after it
-- wait for; lock_timeout bounds that wait, so that a long statement (a report, a
-- previous version's cleaner batch) makes the migration fail fast and be retried
-- (Store.Migrate retries it) instead of holding up every request behind it.
--
-- A process of the previous version keeps working on the migrated table (its
-- statements name no index: testkit.MigrationsOnlyAdd exempts this migration), but
-- its cleaner's batches, which ordered by expires_at, now read the whole table: finish
-- the rolling deploy before a backlog of expired records builds up.
SET LOCAL lock_timeout = '2s';
DROP INDEX IF EXISTS {{schema}}idem_records_expires_at_idx;
