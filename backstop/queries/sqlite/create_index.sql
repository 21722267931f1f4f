-- The cleanup's index: expired rows, oldest expiry first.
CREATE INDEX IF NOT EXISTS {{index}} ON {{table}} (expires_at)
