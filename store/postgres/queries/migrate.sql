-- Statements of Migrate, run in one transaction under an advisory lock.

-- name: MigrateLock
-- Serialises migrations of one schema across processes; released at COMMIT/ROLLBACK.
-- The key hashes the configured schema or, when none is configured, the first schema of
-- the search_path, so that migrations of different schemas never wait for each other.
-- It answers the server process's id: one that differs from the process id the
-- connection was given at its start means a pooler stands in between (migrate.go).
-- $1 configured schema ('' for the search_path).
SELECT pg_backend_pid()
FROM (SELECT pg_advisory_xact_lock(hashtextextended(
    'idem/postgres migrate ' || coalesce(nullif($1::text, ''), current_schema(), ''), 0))) AS locked;

-- name: MigrateSchemaExists
-- $1 schema name.
SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1);

-- name: MigrateCreateTable
CREATE TABLE IF NOT EXISTS {{schema}}idem_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- name: MigrateApplied
SELECT version FROM {{schema}}idem_migrations ORDER BY version;

-- name: MigrateRecord
-- $1 version, $2 name.
INSERT INTO {{schema}}idem_migrations (version, name) VALUES ($1, $2);
