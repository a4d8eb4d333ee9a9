-- Takes one hold (ARGV[2] = '1': every hold) from ARGV[1]'s grant. When the grant goes,
-- wakes the waiters that can now have the lock (see wake in common.lua); with ARGV[5]
-- > 0 ms and an exclusive lock now free, starts a lock-delay first.
-- ARGV: owner all channel key delay_ms sharded
-- Returns the holds left (0: released), or -1 when ARGV[1] does not hold the lock.
local h, d, w, q, x = KEYS[1], KEYS[2], KEYS[4], KEYS[5], KEYS[6]
local owner = ARGV[1]
local now = now_ms()
purge(h, d, w, q, now)

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
if redis.call('ZCARD', h) == 0 then
  local exclusive = redis.call('HGET', d, '~mode') == 'x' and redis.call('HGET', d, '~limit') == '1'
  redis.call('DEL', d)
  local delay = tonumber(ARGV[5])
  if exclusive and delay > 0 then
    redis.call('SET', x, '1', 'PX', int(delay))
  end
end
wake(h, d, w, q, ARGV[3], ARGV[4], ARGV[6])
return 0
