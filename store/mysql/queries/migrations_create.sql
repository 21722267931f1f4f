CREATE TABLE IF NOT EXISTS idem_migrations (
    version    INT          NOT NULL PRIMARY KEY,
    name       VARCHAR(255) NOT NULL,
    applied_at BIGINT       NOT NULL -- unix nanoseconds
) ENGINE = InnoDB
