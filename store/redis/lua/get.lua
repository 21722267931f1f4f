#!lua flags=no-writes
-- get: KEYS[1] record; ARGV: now_us|''.
-- Returns {now_us, fields}, with fields empty when the record is absent or expired by
-- Redis's clock (a record past expires_at counts as absent before its key is evicted).
-- no-writes: Redis runs it whatever its memory use.
local key = KEYS[1]
local now = now_us(ARGV[1])
local exp = redis.call('HGET', key, 'exp')
if not exp or now >= tonumber(exp) then
  return {int(now), {}}
end
return {int(now), redis.call('HGETALL', key)}
