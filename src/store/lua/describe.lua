-- Reads one lock without changing it.
-- Returns {last fence, live waiters, then per live holder:
--          session_id, client_name, hold count, ms left, fence}.
local h, d, f, w = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now = now_ms()
local out = {redis.call('GET', f) or '0', int(redis.call('ZCOUNT', w, '(' .. int(now), '+inf'))}
local live = redis.call('ZRANGEBYSCORE', h, '(' .. int(now), '+inf', 'WITHSCORES')
for i = 1, #live, 2 do
  local v = redis.call('HGET', d, live[i])
  if v then
    local count, fence, sid, name = parse(v)
    out[#out + 1] = sid
    out[#out + 1] = name
    out[#out + 1] = int(count)
    out[#out + 1] = int(tonumber(live[i + 1]) - now)
    out[#out + 1] = fence
  end
end
return out
