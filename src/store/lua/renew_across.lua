-- Renews a batch of grants whose locks live in several slots of one Cluster node (the
-- sidecar groups them by the node that serves each slot). Run with the flag
-- allow-cross-slot-keys (Redis 7): KEYS are the first grant's h and d, which route the
-- call to the node; ARGV are h d owner ttl per grant, the first one included. A key the
-- node does not serve (the slot moved) fails the call; the sidecar then renews that
-- chunk slot by slot.
-- Returns one 1 (renewed) or 0 (not held) per grant, in order.
local now = now_ms()
local out = {}
for i = 1, #ARGV / 4 do
  local at = 4 * (i - 1)
  out[i] = renew_grant(ARGV[at + 1], ARGV[at + 2], ARGV[at + 3], tonumber(ARGV[at + 4]), now)
end
return out
