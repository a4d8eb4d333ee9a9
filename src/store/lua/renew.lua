--#include core
--#include lock
-- Renews a batch of grants: KEYS are the locks, ARGV are owner1 ttl1 owner2 ttl2 ...
-- Returns one character per grant, in order: '1' renewed, '0' not held. One string
-- rather than an array of integers: Redis replies with one bulk string and the sidecar
-- parses one value, not 1,000.
local now = now_ms()
local out = {}
for i = 1, #KEYS do
  out[i] = renew_grant(KEYS[i], ARGV[2 * i - 1], ARGV[2 * i], now)
end
return table.concat(out)
