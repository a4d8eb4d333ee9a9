--#include core
--#include lock
--#include guard
-- Renews a batch of grants: KEYS are the locks, ARGV are the guard (guard.lua: '' on one
-- server), then owner1 ttl1 owner2 ttl2 ...
-- Returns one character per grant, in order: '1' renewed, '0' not held. One string
-- rather than an array of integers: Redis replies with one bulk string and the sidecar
-- parses one value, not 1,000. UNVERIFIED (nothing renewed) on a Cluster master whose
-- tenure the sidecar did not read: a grant it lacks is then not taken for lost.
if not guarded(ARGV[1]) then
  return redis.error_reply(UNVERIFIED)
end
local now = now_ms()
local out = {}
for i = 1, #KEYS do
  out[i] = renew_grant(KEYS[i], ARGV[2 * i], ARGV[2 * i + 1], now)
end
return table.concat(out)
