-- Renews a batch of grants: KEYS are h1 d1 h2 d2 ..., ARGV are owner1 ttl1 owner2 ttl2 ...
-- A grant is renewed only while it is still held (its expiry not passed).
-- Four commands per grant: this script runs for every held lock every TTL/3.
-- Returns one 1 (renewed) or 0 (not held) per grant, in order.
local now = now_ms()
local out = {}
for i = 1, #KEYS / 2 do
  local h, d = KEYS[2 * i - 1], KEYS[2 * i]
  local owner = ARGV[2 * i - 1]
  local expiry = redis.call('ZSCORE', h, owner)
  if expiry and tonumber(expiry) > now then
    local until_ms = int(now + tonumber(ARGV[2 * i]))
    redis.call('ZADD', h, until_ms, owner)
    -- GT: only ever extend, so no ZRANGE for the last expiry (both keys always carry one).
    redis.call('PEXPIREAT', h, until_ms, 'GT')
    redis.call('PEXPIREAT', d, until_ms, 'GT')
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
