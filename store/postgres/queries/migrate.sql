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

-- name: MigrateDropExpiryIndex
-- The index of expiry of 0001, which this release's cleaner never reads (0010 says
-- why it is dropped only once the store's format level allows it). Dropping an index
-- rewrites nothing: the table stays online. DROP INDEX takes the table's ACCESS
-- EXCLUSIVE lock for the moment of the catalog change, which waits for the statements
-- running on the table, and which the statements that come after it wait for; the
-- transaction's lock_timeout (2 s, SET LOCAL first) bounds that wait, so that a long
-- statement makes the drop fail fast and be retried (Store.Migrate retries it) instead
-- of holding up every request behind it.
DROP INDEX IF EXISTS {{schema}}idem_records_expires_at_idx;

-- name: MigrateUnknown
-- The migrations applied by a later release than this one: those numbered after $1,
-- the last this release embeds.
SELECT version, name FROM {{schema}}idem_migrations WHERE version > $1 ORDER BY version;

-- name: MigrateRecord
-- $1 version, $2 name.
INSERT INTO {{schema}}idem_migrations (version, name) VALUES ($1, $2);
