-- Commits one step of the holder's operation (SPEC §13): the new recovery point, the
-- saved results and the operation's name; fenced by the token and the in-flight state.
UPDATE idem_records
SET recovery_point = ?,
    steps          = ?,
    operation      = ?
WHERE scope = ? AND `key` = ? AND state = 'in_flight' AND token = ?
