SELECT version FROM idem_migrations ORDER BY version
