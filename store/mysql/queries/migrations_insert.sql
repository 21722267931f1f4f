INSERT INTO idem_migrations (version, name, applied_at) VALUES (?, ?, ?)
