-- Adds one hold to ARGV[1]'s grant and extends it by ARGV[2] ms.
-- Returns the new hold count, or -1 when ARGV[1] does not hold the lock.
local h, d, w, q = KEYS[1], KEYS[2], KEYS[4], KEYS[5]
local owner, ttl = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
purge(h, d, w, q, now)

local v = redis.call('HGET', d, owner)
if not v then
  return -1
end
local count, fence, sid, name = parse(v)
redis.call('HSET', d, owner, holder_value(count + 1, fence, sid, name))
redis.call('ZADD', h, int(now + ttl), owner)
expire_at_last(h, d)
return count + 1
