-- Leaves ARGV[2] holds on ARGV[1]'s grant: N > 0 sets the hold count to N (the count the
-- session keeps, so a retried release that ran leaves the same count); 0 releases the
-- grant. When the grant goes, wakes the waiters that can now have the lock (see wake in
-- common.lua); with ARGV[5] > 0 ms and an exclusive lock now free, starts a lock-delay
-- first.
-- ARGV: owner count channel key delay_ms sharded
-- Returns the holds left (0: released), or -1 when ARGV[1] does not hold the lock.
local h, d, w, q, x = KEYS[1], KEYS[2], KEYS[4], KEYS[5], KEYS[6]
local owner = ARGV[1]
local now = now_ms()
purge(h, d, w, q, now)

local v = redis.call('HGET', d, owner)
if not v then
  return -1
end
local left = tonumber(ARGV[2])
if left > 0 then
  local _, fence, sid, name = parse(v)
  redis.call('HSET', d, owner, holder_value(left, fence, sid, name))
  return left
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
