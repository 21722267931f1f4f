-- Serialises Migrate across processes for the rest of its transaction: concurrent
-- CREATE TABLE IF NOT EXISTS can otherwise fail on the catalog's unique index.
SELECT pg_advisory_xact_lock(hashtext('idem_backstop:' || $1))
