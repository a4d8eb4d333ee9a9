-- Grants the lock to ARGV[1] when the lock admits its mode and limit, no lock-delay
-- runs, and (fair) nobody queued ahead of it could be granted instead. Otherwise
-- answers busy and, when ARGV[3] is '1', registers the waiter ARGV[9] for ARGV[2] ms
-- (and queues it, when fair).
-- ARGV: owner ttl_ms wait session_id client_name mode limit fair waiter channel key sharded
-- Returns {1, fence} granted; {0, ms until something may change, queue position}
-- busy; {2, the holders' limit} when the holders use another limit.
local h, d, f, w, q, x = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local owner, ttl, mode, limit = ARGV[1], tonumber(ARGV[2]), ARGV[6], tonumber(ARGV[7])
local fair, waiter = ARGV[8] == '1', ARGV[9]
local now = now_ms()
purge(h, d, w, q, now)

local state, n = admit(h, d, mode, limit)
if state == 'conflict' then
  return {2, redis.call('HGET', d, '~limit') or '1'}
end
local delay = redis.call('PTTL', x)
local go = state ~= 'busy' and delay < 0
if go and fair then
  local rank = redis.call('ZRANK', q, waiter)
  local ahead = rank or redis.call('ZCARD', q)
  if ahead > 0 then
    if limit > 1 then
      go = ahead < limit - n
    elseif mode == 'x' then
      go = false
    else
      for _, other in ipairs(redis.call('ZRANGE', q, 0, ahead - 1)) do
        if string.sub(other, 1, 1) ~= 's' then
          go = false
          break
        end
      end
    end
  end
end

if not go then
  if ARGV[3] == '1' then
    redis.call('ZADD', w, int(now + ttl), waiter)
    if fair and not redis.call('ZSCORE', q, waiter) then
      local last = redis.call('ZRANGE', q, -1, -1, 'WITHSCORES')
      redis.call('ZADD', q, int((tonumber(last[2]) or 0) + 1), waiter)
    end
    expire_at_last(w, q)
  end
  -- Look again when the first holder, the delay, or (fair) the first waiter may be gone.
  local look = now + ttl
  local first = redis.call('ZRANGE', h, 0, 0, 'WITHSCORES')
  if #first > 0 then
    look = math.min(look, tonumber(first[2]))
  end
  if delay > 0 then
    look = math.min(look, now + delay)
  end
  local position = 0
  if fair then
    local oldest = redis.call('ZRANGE', w, 0, 0, 'WITHSCORES')
    if #oldest > 0 and oldest[1] ~= waiter then
      look = math.min(look, tonumber(oldest[2]))
    end
    local rank = redis.call('ZRANK', q, waiter)
    position = (rank or redis.call('ZCARD', q)) + 1
  end
  return {0, int(math.max(look - now, 1)), position}
end

-- Fencing token: max(last + 1, store ms * 1024). See next_fence in src/store/mod.rs.
local last = tonumber(redis.call('GET', f) or '0')
local fence = int(math.max(last + 1, now * 1024))
redis.call('SET', f, fence)
redis.call('ZADD', h, int(now + ttl), owner)
redis.call('HSET', d, owner, holder_value(1, fence, ARGV[4], ARGV[5]))
if state == 'free' then
  redis.call('HSET', d, '~mode', mode, '~limit', int(limit))
end
redis.call('ZREM', w, waiter)
redis.call('ZREM', q, waiter)
expire_at_last(h, d)
if mode == 's' or (limit > 1 and n + 1 < limit) then
  -- Room is left for more readers or permits: pass the wake on.
  wake(h, d, w, q, ARGV[10], ARGV[11], ARGV[12])
end
return {1, fence}
