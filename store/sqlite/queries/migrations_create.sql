CREATE TABLE IF NOT EXISTS idem_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT    NOT NULL,
    applied_at INTEGER NOT NULL -- unix nanoseconds
)
