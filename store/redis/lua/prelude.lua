-- Shared helpers, prepended to every script (see scripts.go).
--
-- Times are integer microseconds since the Unix epoch. Lua numbers are doubles, which
-- hold integers up to 2^53 exactly; microseconds since 1970 stay below that until the
-- year 2255. They are stored and returned as decimal strings written with '%d', because
-- tostring() would round them to 14 significant digits.

-- now_us returns the injected time (tests) or Redis's own clock.
local function now_us(arg)
  if arg ~= nil and arg ~= '' then
    return tonumber(arg)
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function int(n)
  return string.format('%d', n)
end

-- expire_after sets the key's TTL to run margin_ms past the record's expires_at, so
-- that the stored 'exp' field, not Redis's eviction of the key, decides expiry. The
-- TTL is relative to now, which maps an injected test clock onto Redis's clock.
local function expire_after(key, exp, now, margin_ms)
  local ms = math.ceil((exp - now) / 1000) + margin_ms
  if ms < 1 then
    ms = 1
  end
  redis.call('PEXPIRE', key, int(ms))
end

-- held reports whether token still holds the record: in flight under that token.
local function held(key, token)
  local r = redis.call('HMGET', key, 'st', 'tok')
  return r[1] == 'in_flight' and token ~= '' and r[2] == token
end
