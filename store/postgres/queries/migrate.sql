-- Statements of Migrate, run in one transaction under an advisory lock.

-- name: MigrateLock
-- Serialises migrations of one schema across processes; released at COMMIT/ROLLBACK.
-- $1 lock key (derived from the schema name).
SELECT pg_advisory_xact_lock($1::bigint);

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
