-- SQLite's write lock already serialises Migrate; a no-op that binds ?1 like
-- PostgreSQL's advisory lock.
SELECT ?1 IS NOT NULL
