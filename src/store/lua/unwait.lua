-- Removes the waiter ARGV[1] (its wait timed out or was cancelled) from w and q. If it
-- was queued, those now first in line may be able to go: wake them (see wake in
-- common.lua), or they would sleep until their next look.
-- ARGV: waiter channel key sharded
local h, d, w, q = KEYS[1], KEYS[2], KEYS[4], KEYS[5]
redis.call('ZREM', w, ARGV[1])
if redis.call('ZREM', q, ARGV[1]) == 1 then
  purge(h, d, w, q, now_ms())
  wake(h, d, w, q, ARGV[2], ARGV[3], ARGV[4])
end
return 0
