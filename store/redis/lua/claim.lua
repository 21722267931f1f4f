#!lua
-- claim: KEYS[1] record; ARGV: now_us|'', fp_version, fp_sum, token, record_id,
-- lease_us, ttl_us, margin_ms, scope_digest, unknown ('1' under the policy unknown).
-- Returns {outcome, now_us, fields}: outcome is acquired, acquired_again, took_over,
-- marked_unknown, completed, in_flight or mismatch; fields is the record's HGETALL
-- (empty when acquired afresh).
-- The decision is idem.Decide's, made here so that no other client can act between
-- the read and the write.
--
-- No flags: the script may write, and Redis refuses to start it while used memory is
-- above maxmemory (a full Redis under noeviction, or one with nothing left to evict),
-- so a full Redis starts no new execution. RecordClaim then answers what needs no
-- write (a replay, in flight, a mismatch) through the get script.
local key = KEYS[1]
local now = now_us(ARGV[1])
local fpv, fp, token, rid = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local lease, ttl, margin = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local scope_digest, unknown = ARGV[9], ARGV[10]

local r = redis.call('HMGET', key, 'st', 'fpv', 'fp', 'lease', 'exp', 'ctime', 'tok')
local st = r[1]
if st and now < tonumber(r[5]) then
  -- Our own token: go-redis re-sent this claim after a network error hid the answer
  -- of a first run that did acquire the key. Tokens are fresh random values.
  if st == 'in_flight' and r[7] == token then
    return {'acquired_again', int(now), redis.call('HGETALL', key)}
  end
  -- Fingerprints of different versions cannot be compared and count as matching,
  -- except a keyed one (version 1000 and up) and a plain one, which never match
  -- (idemstore.Fingerprint.Matches).
  if (r[2] == fpv and r[3] ~= fp) or ((tonumber(r[2]) >= 1000) ~= (tonumber(fpv) >= 1000)) then
    return {'mismatch', int(now), redis.call('HGETALL', key)}
  end
  if st == 'completed' then
    return {'completed', int(now), redis.call('HGETALL', key)}
  end
  if now < tonumber(r[4]) then
    return {'in_flight', int(now), redis.call('HGETALL', key)}
  end
  -- The holder's lease lapsed. Under the policy unknown (SPEC §13) its outcome is
  -- unknown: complete the record so that every retry gets outcome_unknown until an
  -- operator resolves it.
  if unknown == '1' then
    local exp = tonumber(r[6]) + ttl
    redis.call('HSET', key, 'st', 'completed', 'exp', int(exp), 'status', '500', 'ou', '1')
    redis.call('HDEL', key, 'tok', 'lease', 'hdr', 'body', 'ns')
    expire_after(key, exp, now, margin)
    return {'marked_unknown', int(now), redis.call('HGETALL', key)}
  end
  -- Otherwise take over, keeping the record id and created_at.
  local lease_end = now + lease
  local exp = math.max(tonumber(r[6]) + ttl, lease_end)
  redis.call('HSET', key, 'tok', token, 'lease', int(lease_end), 'exp', int(exp))
  expire_after(key, exp, now, margin)
  return {'took_over', int(now), redis.call('HGETALL', key)}
end

-- Absent or expired: claim afresh. DEL drops an expired record's leftover fields.
redis.call('DEL', key)
local lease_end = now + lease
local exp = math.max(now + ttl, lease_end)
redis.call('HSET', key, 'id', rid, 'fpv', fpv, 'fp', fp, 'st', 'in_flight', 'tok', token,
  'lease', int(lease_end), 'ctime', int(now), 'exp', int(exp), 'sc', scope_digest)
expire_after(key, exp, now, margin)
return {'acquired', int(now), {}}
