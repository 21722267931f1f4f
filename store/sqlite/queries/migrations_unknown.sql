-- The migrations applied by a later release than this one: those numbered after
-- :version, the last this release embeds.
SELECT version, name FROM idem_migrations WHERE version > :version ORDER BY version
