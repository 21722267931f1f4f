-- Deletes the row of (scope, key) in the operation's transaction: its response
-- releases the key (SPEC §6), so a retry executes afresh. $1 scope, $2 key.
DELETE FROM {{table}} WHERE scope = $1 AND idempotency_key = $2
