--#include core
--#include lock
-- Reads one lock without changing it.
-- Returns {last fence, live waiters, holders' mode or '', holders' limit or '0',
--          number of live holders, then per holder: session_id, client_name, hold
--          count, ms left, fence, value; then per fair waiter, oldest first: mode,
--          session_id, client_name}.
local h, w, q = KEYS[1], KEYS[2], KEYS[3]
local now = now_ms()
local lock = load(h, now)
if not lock then
  -- A v1 lock: shown as held by an unnamed holder until it expires.
  return {'0', '0', 'x', '1', '1', '', '', '1', int(math.max(redis.call('PTTL', h), 0)), '0', ''}
end
local holders = {}
for owner, holder in pairs(lock.holders) do
  if holder.expiry > now then
    -- The session id is the owner's part before the first '.'; the rest is secret.
    holders[#holders + 1] = {string.match(owner, '^([^.]*)'), holder.name, int(holder.count),
      int(holder.expiry - now), holder.fence, holder.value}
  end
end
local out = {
  int(lock.fence),
  int(redis.call('ZCOUNT', w, '(' .. int(now), '+inf')),
  #holders > 0 and lock.mode or '',
  #holders > 0 and int(lock.limit) or '0',
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
