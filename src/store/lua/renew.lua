--#include core
--#include lock
-- Renews a batch of grants: KEYS are the locks, ARGV are owner1 ttl1 owner2 ttl2 ...
-- Returns one 1 (renewed) or 0 (not held) per grant, in order.
local now = now_ms()
local out = {}
for i = 1, #KEYS do
  out[i] = renew_grant(KEYS[i], ARGV[2 * i - 1], ARGV[2 * i], now)
end
return out
