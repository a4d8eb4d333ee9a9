-- Renews a batch of grants: KEYS are h1 d1 h2 d2 ..., ARGV are owner1 ttl1 owner2 ttl2 ...
-- A grant is renewed only while it is still held (its expiry not passed).
-- Returns one 1 (renewed) or 0 (not held) per grant, in order.
local now = now_ms()
local out = {}
for i = 1, #KEYS / 2 do
  local h, d = KEYS[2 * i - 1], KEYS[2 * i]
  local owner = ARGV[2 * i - 1]
  local expiry = redis.call('ZSCORE', h, owner)
  if expiry and tonumber(expiry) > now then
    redis.call('ZADD', h, int(now + tonumber(ARGV[2 * i])), owner)
    expire_at_last(h, d)
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
