-- Takes one hold (ARGV[2] = '1': every hold) from ARGV[1]'s grant. When the grant goes
-- and somebody waits, publishes the lock's name ARGV[4] on channel ARGV[3].
-- Returns the holds left (0: released), or -1 when ARGV[1] does not hold the lock.
local h, d, w = KEYS[1], KEYS[2], KEYS[4]
local owner = ARGV[1]
local now = now_ms()
purge(h, d, w, now)

local v = redis.call('HGET', d, owner)
if not v then
  return -1
end
local count, fence, sid, name = parse(v)
if ARGV[2] ~= '1' and count > 1 then
  redis.call('HSET', d, owner, holder_value(count - 1, fence, sid, name))
  return count - 1
end
redis.call('HDEL', d, owner)
redis.call('ZREM', h, owner)
if redis.call('ZCARD', w) > 0 then
  redis.call('PUBLISH', ARGV[3], ARGV[4])
end
return 0
