-- The migrations applied by a later release than this one: those numbered after the
-- last this release embeds.
SELECT version, name FROM idem_migrations WHERE version > ? ORDER BY version
