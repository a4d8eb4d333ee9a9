-- Sets ARGV[1]'s hold count to ARGV[2] (at least 1) and extends its grant by ARGV[3] ms.
-- The count is the one the session wants, not "one more": a retried or timed-out hold
-- that ran leaves the same count (the session is the authority; the store mirrors it).
-- Returns the count set, or -1 when ARGV[1] does not hold the lock.
local h, d, w, q = KEYS[1], KEYS[2], KEYS[4], KEYS[5]
local owner, want, ttl = ARGV[1], math.max(tonumber(ARGV[2]), 1), tonumber(ARGV[3])
local now = now_ms()
purge(h, d, w, q, now)

local v = redis.call('HGET', d, owner)
if not v then
  return -1
end
local _, fence, sid, name = parse(v)
redis.call('HSET', d, owner, holder_value(want, fence, sid, name))
redis.call('ZADD', h, int(now + ttl), owner)
expire_at_last(h, d)
return want
