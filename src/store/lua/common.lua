-- Prelude of every Lockside script (src/store/redis.rs concatenates it in front).
--
-- Keys of one lock, all under the hash tag {ns:KEY} so they share a Cluster slot:
--   KEYS[1] h  zset  owner -> expiry (store ms)        the holders
--   KEYS[2] d  hash  owner -> "count|fence|session_id|client_name"
--   KEYS[3] f  string the last fencing token issued; never expires
--   KEYS[4] w  zset  owner -> expiry (store ms)        the waiters
-- Only the store's clock (TIME) is written into Redis; sidecar clocks never are.
-- Numbers are written with string.format('%d'): tostring() would print 1.8e+15.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function int(n)
  return string.format('%d', n)
end

-- Drops holders and waiters whose expiry has passed (expiry <= now).
local function purge(h, d, w, now)
  local gone = redis.call('ZRANGEBYSCORE', h, '-inf', int(now))
  for _, owner in ipairs(gone) do
    redis.call('HDEL', d, owner)
  end
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', h, '-inf', int(now))
  end
  redis.call('ZREMRANGEBYSCORE', w, '-inf', int(now))
end

-- Keeps zset z (and its companion hash) until its last entry expires, so a lock whose
-- every sidecar died leaves nothing behind but its fence counter.
local function expire_at_last(z, companion)
  local last = redis.call('ZRANGE', z, -1, -1, 'WITHSCORES')
  if #last == 0 then
    return
  end
  redis.call('PEXPIREAT', z, last[2])
  if companion then
    redis.call('PEXPIREAT', companion, last[2])
  end
end

local function parse(v)
  local count, fence, sid, name = string.match(v, '^(%d+)|(%d+)|([^|]*)|(.*)$')
  return tonumber(count), fence, sid, name
end

local function holder_value(count, fence, sid, name)
  return int(count) .. '|' .. fence .. '|' .. sid .. '|' .. name
end
