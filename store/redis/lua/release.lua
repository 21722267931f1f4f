#!lua flags=allow-oom
-- release: KEYS[1] record; ARGV: token.
-- Returns 1 when the in-flight record was deleted, 0 when token no longer holds it.
-- allow-oom: a holder can always give its key back, even once Redis is past maxmemory.
if not held(KEYS[1], ARGV[1]) then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
