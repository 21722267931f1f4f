-- Commits one step of the holder's operation (SPEC §13): the new recovery point, the
-- saved results and the operation's name; fenced by the token and the in-flight state.
UPDATE idem_records
SET recovery_point = :recovery_point,
    steps          = :steps,
    operation      = :operation
WHERE scope = :scope AND key = :key AND state = 'in_flight' AND token = :token
