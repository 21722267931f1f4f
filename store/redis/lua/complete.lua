#!lua flags=allow-oom
-- complete: KEYS[1] record; ARGV: now_us|'', token, ttl_us, margin_ms, status, headers,
-- body, not_stored ('1' or '0').
-- Returns 1 when stored, 0 when token no longer holds the record (lease lost).
-- allow-oom: work that claimed its key while Redis had room can always record its
-- outcome, even once Redis is past maxmemory.
local key = KEYS[1]
local now = now_us(ARGV[1])
if not held(key, ARGV[2]) then
  return 0
end
local exp = tonumber(redis.call('HGET', key, 'ctime')) + tonumber(ARGV[3])
redis.call('HSET', key, 'st', 'completed', 'exp', int(exp), 'status', ARGV[5],
  'hdr', ARGV[6], 'body', ARGV[7], 'ns', ARGV[8])
redis.call('HDEL', key, 'tok', 'lease')
expire_after(key, exp, now, tonumber(ARGV[4]))
return 1
