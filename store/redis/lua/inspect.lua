#!lua flags=no-writes
-- inspect: KEYS[1] record; ARGV: now_us|''.
-- Returns {now_us, fields}: the record's HGETALL in any state, expired or not (until
-- Redis evicts its key), empty when there is none. For operators (admin.go).
-- no-writes: Redis runs it whatever its memory use.
return {int(now_us(ARGV[1])), redis.call('HGETALL', KEYS[1])}
