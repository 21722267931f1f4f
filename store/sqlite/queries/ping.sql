-- Reads the schema page, so that a ping touches the database file.
SELECT count(*) FROM sqlite_schema
