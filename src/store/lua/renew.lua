-- Renews a batch of grants: KEYS are h1 d1 h2 d2 ..., ARGV are owner1 ttl1 owner2 ttl2 ...
-- Returns one 1 (renewed) or 0 (not held) per grant, in order.
local now = now_ms()
local out = {}
for i = 1, #KEYS / 2 do
  out[i] = renew_grant(KEYS[2 * i - 1], KEYS[2 * i], ARGV[2 * i - 1], tonumber(ARGV[2 * i]), now)
end
return out
