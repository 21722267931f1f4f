#!lua flags=allow-oom
-- renew: KEYS[1] record; ARGV: now_us|'', token, lease_us, ttl_us, margin_ms.
-- Returns the new lease end (microseconds, a string), or 0 when token no longer holds
-- the record (lease lost).
-- allow-oom: a holder keeps its lease while Redis is past maxmemory (the record only
-- changes in place).
local key = KEYS[1]
local now = now_us(ARGV[1])
if not held(key, ARGV[2]) then
  return 0
end
local lease_end = now + tonumber(ARGV[3])
local exp = math.max(tonumber(redis.call('HGET', key, 'ctime')) + tonumber(ARGV[4]), lease_end)
redis.call('HSET', key, 'lease', int(lease_end), 'exp', int(exp))
expire_after(key, exp, now, tonumber(ARGV[5]))
return int(lease_end)
