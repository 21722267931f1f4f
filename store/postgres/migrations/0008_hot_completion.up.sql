-- Completions that write no index entry (issue 21). A completion updates the record it
-- claimed; PostgreSQL writes such an update heap-only (HOT: the new row version on the
-- same page, no index entry) only when it changes no indexed column, counting the
-- columns of a partial index's predicate. idem_records_resumable_idx (0004) read
-- state, which every completion changes, so every completion wrote a new entry in each
-- index of the table (the primary key, expires_at): two more WAL records and two more
-- index entries a request on the lease path (benchtool wal).
--
-- The index of unfinished operations (in flight, their recovery point advanced: the
-- completer's listing and count, SPEC §13) reads recovery_point only, which a record
-- without steps never sets, and which a completion clears (the recovery point says
-- where an unfinished operation stands; its steps' results stay). Completed records
-- that kept theirs before this migration lose it here (but for those whose outcome is
-- unknown: where it stopped helps the operator who resolves it), so that the index
-- holds the unfinished operations alone; then the old index goes.
--
-- Dropping an index breaks no process of the previous version, which names none
-- (testkit.MigrationsOnlyAdd exempts this migration): its listing's predicate implies
-- this index's, and its completions, which keep the recovery point, only leave a
-- completed record in the index until it expires (the listing reads state too).
--
-- fillfactor leaves each new page a fifth empty for the HOT update of the records
-- inserted into it, which grow by their response.
UPDATE {{schema}}idem_records SET recovery_point = NULL
WHERE state = 'completed' AND recovery_point IS NOT NULL AND NOT outcome_unknown;

CREATE INDEX idem_records_unfinished_idx ON {{schema}}idem_records (scope, key)
WHERE recovery_point IS NOT NULL;

DROP INDEX {{schema}}idem_records_resumable_idx;

ALTER TABLE {{schema}}idem_records SET (fillfactor = 80);
