--#include core
--#include lock
-- Removes the waiter ARGV[1] (its wait timed out or was cancelled) from w and q. If it
-- was queued, those now first in line may be able to go: wake them (see wake in
-- lock.lua), or they would sleep until their next look.
-- ARGV: waiter channel key sharded
local h, w, q, l = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
redis.call('ZREM', w, ARGV[1])
if redis.call('ZREM', q, ARGV[1]) == 1 then
  local now = now_ms()
  local lock = load(h, now)
  if lock then
    purge(h, lock, now)
    wake(w, q, l, lock, ARGV[2], ARGV[3], ARGV[4], now)
  end
end
return 0
