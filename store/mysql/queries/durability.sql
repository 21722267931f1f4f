-- The server's settings that decide whether a committed claim survives a crash
-- (durabilityWarnings).
SELECT @@innodb_flush_log_at_trx_commit, @@sync_binlog, @@log_bin, version()
