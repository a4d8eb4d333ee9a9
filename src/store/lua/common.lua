-- Prelude of every Lockside script (src/store/redis.rs concatenates it in front).
--
-- Keys of one lock, all under the hash tag {ns:KEY} so they share a Cluster slot:
--   KEYS[1] h  zset    owner -> expiry (store ms)                    the holders
--   KEYS[2] d  hash    owner -> "count|fence|session_id|client_name", and the holders'
--                      '~mode' ('x' exclusive, 's' shared) and '~limit' (1, or N for a
--                      semaphore); deleted with the last holder
--   KEYS[3] f  string  the last fencing token issued; never expires
--   KEYS[4] w  zset    waiter -> expiry (store ms)                   every waiter
--   KEYS[5] q  zset    waiter -> arrival number                      fair waiters, in order
--   KEYS[6] x  string  exists while a lock-delay keeps the lock from anyone
-- A waiter is named "mode|limit|owner|session_id|client_name" (built by the sidecar):
-- one string in w and q, and Describe can show the queue without owner tokens.
-- Only the store's clock (TIME) is written into Redis; sidecar clocks never are.
-- Numbers are written with string.format('%d'): tostring() would print 1.8e+15.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function int(n)
  return string.format('%d', n)
end

-- Drops holders and waiters whose expiry has passed (expiry <= now). A dead sidecar's
-- waiter leaves the fair queue here, at most one TTL after its last refresh.
local function purge(h, d, w, q, now)
  local gone = redis.call('ZRANGEBYSCORE', h, '-inf', int(now))
  for _, owner in ipairs(gone) do
    redis.call('HDEL', d, owner)
  end
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', h, '-inf', int(now))
    if redis.call('ZCARD', h) == 0 then
      redis.call('DEL', d)
    end
  end
  local left = redis.call('ZRANGEBYSCORE', w, '-inf', int(now))
  for _, waiter in ipairs(left) do
    redis.call('ZREM', q, waiter)
  end
  if #left > 0 then
    redis.call('ZREMRANGEBYSCORE', w, '-inf', int(now))
  end
end

-- Keeps zset z (and its companion key) until z's last entry expires, so a lock whose
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

local function parse_waiter(waiter)
  local mode, limit, owner, sid, name = string.match(waiter, '^([xs])|(%d+)|([^|]*)|([^|]*)|(.*)$')
  return mode, tonumber(limit), owner, sid, name
end

-- Whether the lock admits a new holder of this mode and limit: 'free', 'ok' (joins the
-- current holders), 'busy', or 'conflict' (the holders use another limit). Also the
-- number of holders.
local function admit(h, d, mode, limit)
  local n = redis.call('ZCARD', h)
  if n == 0 then
    return 'free', n
  end
  local held = tonumber(redis.call('HGET', d, '~limit') or '1')
  if held ~= limit then
    return 'conflict', n
  end
  if limit > 1 then
    if n < limit then
      return 'ok', n
    end
    return 'busy', n
  end
  if mode == 's' and redis.call('HGET', d, '~mode') == 's' then
    return 'ok', n
  end
  return 'busy', n
end

-- The fair waiters the lock would admit now, oldest first (at most 64 per call): the
-- head; readers behind a reader head up to the first writer; free permits of a
-- semaphore. A writer at the head stops every reader behind it: no writer starvation.
-- Reads only as much of the queue as can be admitted (one entry behind a writer).
local function heads(h, d, q)
  local n = redis.call('ZCARD', h)
  local room, readers_only = 0, false
  if n == 0 then
    local first = redis.call('ZRANGE', q, 0, 0)
    if #first == 0 then
      return {}
    end
    local mode, limit, owner = parse_waiter(first[1])
    if limit > 1 then
      room = limit
    elseif mode == 's' then
      room, readers_only = 64, true
    else
      return {owner}
    end
  else
    local limit = tonumber(redis.call('HGET', d, '~limit') or '1')
    if limit > 1 then
      room = limit - n
    elseif redis.call('HGET', d, '~mode') == 's' then
      room, readers_only = 64, true
    end
  end
  local out = {}
  if room <= 0 then
    return out
  end
  for _, waiter in ipairs(redis.call('ZRANGE', q, 0, math.min(room, 64) - 1)) do
    local mode, _, owner = parse_waiter(waiter)
    if readers_only and mode ~= 's' then
      break
    end
    out[#out + 1] = owner
  end
  return out
end

-- Publishes "KEY" followed by "\nOWNER" per fair waiter to wake, when anyone waits:
-- fair waiters are woken by name; a bare key wakes one unfair waiter per sidecar.
-- sharded = '1' (Redis Cluster): SPUBLISH to the key's own shard channel, which shares
-- the lock's hash tag, so only the sidecars waiting on this key hear it.
local function wake(h, d, w, q, channel, key, sharded)
  local waiting = redis.call('ZCARD', w)
  if waiting == 0 then
    return
  end
  local queued = redis.call('ZCARD', q)
  local message, named = key, 0
  if queued > 0 then
    for _, owner in ipairs(heads(h, d, q)) do
      message = message .. '\n' .. owner
      named = named + 1
    end
  end
  if named > 0 or waiting > queued then
    redis.call(sharded == '1' and 'SPUBLISH' or 'PUBLISH', channel, message)
  end
end

-- Extends owner's grant of lock (h, d) by ttl ms while it is still held (its expiry not
-- passed). Returns 1 when renewed, 0 when not held. Four commands: renewals run for
-- every held lock every TTL/3.
local function renew_grant(h, d, owner, ttl, now)
  local expiry = redis.call('ZSCORE', h, owner)
  if expiry and tonumber(expiry) > now then
    local until_ms = int(now + ttl)
    redis.call('ZADD', h, until_ms, owner)
    -- GT: only ever extend, so no ZRANGE for the last expiry (both keys always carry one).
    redis.call('PEXPIREAT', h, until_ms, 'GT')
    redis.call('PEXPIREAT', d, until_ms, 'GT')
    return 1
  end
  return 0
end
