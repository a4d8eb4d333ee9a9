-- Reads one lock without changing it.
-- Returns {last fence, live waiters, holders' mode or '', holders' limit or '0',
--          number of live holders, then per holder: session_id, client_name,
--          hold count, ms left, fence; then per fair waiter, oldest first:
--          mode, session_id, client_name}.
local h, d, f, w, q = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local now = now_ms()
local live = redis.call('ZRANGEBYSCORE', h, '(' .. int(now), '+inf', 'WITHSCORES')
local holders = {}
for i = 1, #live, 2 do
  local v = redis.call('HGET', d, live[i])
  if v then
    local count, fence, sid, name = parse(v)
    holders[#holders + 1] = {sid, name, int(count), int(tonumber(live[i + 1]) - now), fence}
  end
end
local out = {
  redis.call('GET', f) or '0',
  int(redis.call('ZCOUNT', w, '(' .. int(now), '+inf')),
  #holders > 0 and (redis.call('HGET', d, '~mode') or 'x') or '',
  #holders > 0 and (redis.call('HGET', d, '~limit') or '1') or '0',
  int(#holders),
}
for _, holder in ipairs(holders) do
  for _, field in ipairs(holder) do
    out[#out + 1] = field
  end
end
for _, waiter in ipairs(redis.call('ZRANGE', q, 0, -1)) do
  local expiry = redis.call('ZSCORE', w, waiter)
  if expiry and tonumber(expiry) > now then
    local mode, _, _, sid, name = parse_waiter(waiter)
    out[#out + 1] = mode
    out[#out + 1] = sid
    out[#out + 1] = name
  end
end
return out
