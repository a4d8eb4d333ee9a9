--#include core
--#include lock
--#include guard
-- Renews a batch of grants whose locks live in several slots of one Cluster node (the
-- sidecar groups them by the node that serves each slot). Run with the flag
-- allow-cross-slot-keys (Redis 7): KEYS[1] is the first grant's lock, which routes the
-- call to the node; ARGV are the guard (guard.lua), then lock owner ttl per grant, the
-- first one included. A key the node does not serve (the slot moved) fails the call;
-- the sidecar then reads the slot map again.
-- Returns one character per grant, in order: '1' renewed, '0' not held (as renew.lua);
-- UNVERIFIED (nothing renewed) on a master whose tenure the sidecar did not read.
if not guarded(ARGV[1]) then
  return redis.error_reply(UNVERIFIED)
end
local now = now_ms()
local out = {}
for i = 1, (#ARGV - 1) / 3 do
  local at = 3 * (i - 1) + 1
  out[i] = renew_grant(ARGV[at + 1], ARGV[at + 2], ARGV[at + 3], now)
end
return table.concat(out)
