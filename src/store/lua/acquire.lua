-- Grants the lock to ARGV[1] when nobody holds it; otherwise answers busy and, when
-- ARGV[3] is '1', registers ARGV[1] as a waiter for ARGV[2] ms.
-- ARGV: owner ttl_ms wait session_id client_name
-- Returns {1, fence} when granted, {0, ms until the first holder expires} when busy.
local h, d, f, w = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, ttl = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
purge(h, d, w, now)

local first = redis.call('ZRANGE', h, 0, 0, 'WITHSCORES')
if #first > 0 then
  if ARGV[3] == '1' then
    redis.call('ZADD', w, int(now + ttl), owner)
    expire_at_last(w)
  end
  return {0, int(tonumber(first[2]) - now)}
end

-- Fencing token: max(last + 1, store ms * 1024). See next_fence in src/store/mod.rs.
local last = tonumber(redis.call('GET', f) or '0')
local fence = int(math.max(last + 1, now * 1024))
redis.call('SET', f, fence)
redis.call('ZADD', h, int(now + ttl), owner)
redis.call('HSET', d, owner, holder_value(1, fence, ARGV[4], ARGV[5]))
redis.call('ZREM', w, owner)
expire_at_last(h, d)
return {1, fence}
