--#include core
-- Registers ARGV[1] (a sidecar, '@id') as a watcher of the lock for ARGV[2] ms, so that
-- its changes are published while nobody waits for it; ARGV[2] = '0' unregisters it.
-- The sidecar registers again before the registration expires, for as long as it
-- watches; a dead sidecar's registration expires by itself.
-- ARGV: watcher ttl_ms
local l = KEYS[4]
local ttl = tonumber(ARGV[2])
if ttl == 0 then
  redis.call('ZREM', l, ARGV[1])
  return 1
end
local now = now_ms()
local expiry = now + ttl
redis.call('ZADD', l, int(expiry), ARGV[1])
redis.call('ZREMRANGEBYSCORE', l, '-inf', int(now))
local latest = redis.call('ZRANGE', l, -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', l, latest[2])
return 1
