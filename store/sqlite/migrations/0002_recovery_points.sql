-- Recovery points (SPEC §13). recovery_point (0001) names the last committed step of
-- the operation; steps holds the results the committed steps saved, as the idem.Handle
-- encodes them (NULL until a step commits); operation names the operation, so that the
-- completer finds its resume function.
ALTER TABLE idem_records ADD COLUMN steps BLOB;
ALTER TABLE idem_records ADD COLUMN operation TEXT NOT NULL DEFAULT '';

-- The completer's query (record_list_resumable.sql): in-flight records whose recovery
-- point advanced, in (scope, key) order. It holds only operations interrupted after a
-- step, so it stays small however many records the table holds.
CREATE INDEX idem_records_resumable ON idem_records (scope, key)
WHERE state = 'in_flight' AND recovery_point <> '';
