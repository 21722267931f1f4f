#!lua flags=allow-oom
-- resolve: KEYS[1] record; ARGV: now_us|'', scope_digest, mode ('release'|'complete'),
-- status, headers, body.
-- Resolves a record completed as outcome unknown (SPEC §13; admin.go): release deletes
-- it, complete stores the operator's response in it, its expiry unchanged.
-- Returns 1 when resolved, 0 when there is no live record of the scope, -1 when the
-- record's outcome is not unknown (untouched).
-- allow-oom: an operator can always resolve a key.
local key = KEYS[1]
local r = redis.call('HMGET', key, 'st', 'exp', 'sc', 'ou')
if not r[1] or r[3] ~= ARGV[2] or now_us(ARGV[1]) >= tonumber(r[2]) then
  return 0
end
if r[4] ~= '1' then
  return -1
end
if ARGV[3] == 'release' then
  redis.call('DEL', key)
  return 1
end
redis.call('HSET', key, 'status', ARGV[4], 'hdr', ARGV[5], 'body', ARGV[6])
redis.call('HDEL', key, 'ou', 'ns')
return 1
