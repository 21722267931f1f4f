-- Deletes up to :limit records whose expires_at overflowed int64 (SQLite kept a REAL):
-- written with a TTL past idem.MaxTTL by a version that accepted one. They sort after
-- every integer along the expires_at index. The cleanup removes them as expired: no
-- store can honour the expiry they were given. An unfinished operation's is spared, as
-- record_delete_expired.sql spares it (SPEC §13): it never expires until it completes.
DELETE FROM idem_records
WHERE rowid IN (
    SELECT rowid FROM idem_records
    WHERE expires_at > 9223372036854775807
      AND NOT (state = 'in_flight' AND recovery_point <> '')
    LIMIT :limit
)
