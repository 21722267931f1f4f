-- Statements that tell the operator about the database the store runs on.

-- name: Replication
-- What a failover of this server may lose (replication.go): the settings that decide
-- it, the streaming standbys and how many of them are synchronous ('sync' or, under
-- ANY n (…), 'quorum'), and how many rows hide their sync_state (a role without
-- pg_read_all_stats, pg_monitor's, sees a standby's pid only). It also answers the
-- server process's id, to tell a pooler in between (migrate.go).
SELECT current_setting('synchronous_standby_names'),
       current_setting('synchronous_commit'),
       pg_is_in_recovery(),
       pg_backend_pid(),
       count(r.pid),
       count(r.pid) FILTER (WHERE r.sync_state IN ('sync', 'quorum')),
       count(r.pid) FILTER (WHERE r.sync_state IS NULL)
FROM (SELECT 1) AS one
LEFT JOIN pg_stat_replication r ON true;

-- name: SessionSynchronousCommit
-- The synchronous_commit of the pool's sessions, as the server, the database, the
-- role and the connection's parameters set it (durability.go): whether the statements
-- that write a record need to raise it.
SELECT current_setting('synchronous_commit');
