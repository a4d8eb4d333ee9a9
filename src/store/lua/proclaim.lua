--#include core
-- Replaces the value of ARGV[1]'s grant with ARGV[2] (empty: no value) and tells the
-- key's watchers.
-- ARGV: owner value channel key sharded
-- Returns 1 when ARGV[1] holds the lock, 0 (nothing changed) when not.
local h, l = KEYS[1], KEYS[4]
local owner = ARGV[1]
local single_lock, count, fence, tail = own_single(h, owner)
if single_lock then
  if not count then
    return 0
  end
  local head, len, at = string.match(tail, '^([^|]*|(%d+)|)()')
  local name = string.sub(tail, at, at + tonumber(len) - 1)
  redis.call('SET', h, single(count, fence, head .. name .. ARGV[2]), 'KEEPTTL')
else
  local okh, r = pcall(redis.call, 'HGET', h, owner)
  if not okh or not r then
    return 0
  end
  local expiry = string.match(r, '|(%d+)$')
  if not expiry or tonumber(expiry) <= now_ms() then
    return 0
  end
  if ARGV[2] == '' then
    redis.call('HDEL', h, 'v:' .. owner)
  else
    redis.call('HSET', h, 'v:' .. owner, ARGV[2])
  end
end
changed(l, ARGV[3], ARGV[4], ARGV[5])
return 1
