#!lua flags=allow-oom
-- delete: KEYS[1] record; ARGV: now_us|'', scope_digest|'' (any scope), force ('1'|'0').
-- Returns 1 when it deleted the record, 0 when there is none (or it belongs to another
-- scope), -1 when it kept it: in flight under a live lease, and not forced.
-- For operators (admin.go): one key, or each key a scan of a scope finds.
-- allow-oom: deleting frees memory, so it runs even once Redis is past maxmemory.
local key = KEYS[1]
local r = redis.call('HMGET', key, 'st', 'lease', 'sc')
if not r[1] then
  return 0
end
if ARGV[2] ~= '' and r[3] ~= ARGV[2] then
  return 0
end
if ARGV[3] ~= '1' and r[1] == 'in_flight' and now_us(ARGV[1]) < tonumber(r[2]) then
  return -1
end
redis.call('DEL', key)
return 1
