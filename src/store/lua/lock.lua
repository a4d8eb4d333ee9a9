-- Helpers of the paths beyond the common case (`--#include lock`): reading and writing
-- a lock in any of its forms, waiters, fair queues, notices. Scripts include them
-- after their fast path, so the common case does not pay for defining them.

-- The name and the value in an exclusive lock's tail ('owner|name length|name' and the
-- value).
local function tail_parts(tail)
  local len, at = string.match(tail, '^[^|]*|(%d+)|()')
  if not at then
    return '', ''
  end
  len = tonumber(len)
  return string.sub(tail, at, at + len - 1), string.sub(tail, at + len)
end

-- The lock's state: its holders (owner -> {count, fence, expiry, name, value}), how
-- many, their mode and limit, the last token, the lock-delay's end; `hash` when it is
-- kept as a hash. nil when h is a lock of the previous data model.
local function load(h, now)
  local lock = {holders = {}, n = 0, fence = 0, limit = 0}
  local ok, v = pcall(redis.call, 'GET', h)
  if ok then
    if not v then
      return lock
    end
    if string.sub(v, 1, 1) == 'x' then
      local count, fence, tail, owner = parse_single(v)
      if count then
        local name, value = tail_parts(tail)
        local expiry = now + math.max(redis.call('PTTL', h), 0)
        lock.holders[owner] = {count = tonumber(count), fence = fence, expiry = expiry, name = name, value = value}
        lock.n, lock.mode, lock.limit, lock.fence = 1, 'x', 1, tonumber(fence)
      end
    else
      local fence, delay = string.match(v, '^f|(%d+)|(%d+)')
      lock.fence = tonumber(fence or '0')
      if delay and tonumber(delay) > now then
        lock.delay = tonumber(delay)
      end
    end
    return lock
  end
  local okh, all = pcall(redis.call, 'HGETALL', h)
  if not okh then
    return nil
  end
  lock.hash = true
  local names, values = {}, {}
  for i = 1, #all, 2 do
    local k, v = all[i], all[i + 1]
    if k == 'm' then
      lock.mode, lock.limit = string.sub(v, 1, 1), tonumber(string.sub(v, 2))
    elseif k == 'f' then
      lock.fence = tonumber(v)
    else
      local tag = string.sub(k, 1, 2)
      if tag == 'n:' then
        names[string.sub(k, 3)] = v
      elseif tag == 'v:' then
        values[string.sub(k, 3)] = v
      else
        local count, fence, expiry = string.match(v, '^(%d+)|(%d+)|(%d+)$')
        if expiry then
          lock.holders[k] = {count = tonumber(count), fence = fence, expiry = tonumber(expiry)}
          lock.n = lock.n + 1
        end
      end
    end
  end
  for owner, holder in pairs(lock.holders) do
    holder.name, holder.value = names[owner] or '', values[owner] or ''
  end
  return lock
end

-- A hash holder's record.
local function record(count, fence, expiry)
  return int(count) .. '|' .. fence .. '|' .. int(expiry)
end

-- The latest expiry of the lock's grants (0 when none).
local function last_expiry(lock)
  local last = 0
  for _, holder in pairs(lock.holders) do
    if holder.expiry > last then
      last = holder.expiry
    end
  end
  return last
end

-- Writes that the lock has no holder any more: its key keeps only the last token and
-- the end of a lock-delay of `delay` ms, until `expiry` (the last grant's), the delay's
-- end, or the clock's passing the token, whichever is last; or goes when all have
-- passed.
local function rest(h, lock, now, delay, expiry)
  local keep = expiry
  if lock.fence >= now * 1024 then
    keep = math.max(keep, math.floor(lock.fence / 1024) + 1)
  end
  local until_ms = 0
  if delay > 0 then
    until_ms = now + delay
  end
  keep = math.max(keep, until_ms)
  if keep > now then
    redis.call('SET', h, 'f|' .. int(lock.fence) .. '|' .. int(until_ms), 'PXAT', keep)
  else
    redis.call('DEL', h)
  end
  lock.holders, lock.n, lock.mode, lock.limit, lock.hash = {}, 0, nil, 0, nil
  lock.delay = until_ms > 0 and until_ms or nil
end

-- Drops the grants whose expiry has passed (a dead sidecar's), in Redis and in lock.
local function purge(h, lock, now)
  local gone = 0
  for owner, holder in pairs(lock.holders) do
    if holder.expiry <= now then
      if lock.hash then
        redis.call('HDEL', h, owner, 'n:' .. owner, 'v:' .. owner)
      end
      lock.holders[owner] = nil
      lock.n = lock.n - 1
      gone = gone + 1
    end
  end
  if gone > 0 and lock.n == 0 then
    rest(h, lock, now, 0, 0)
  end
end

-- Writes a new grant of `owner` (token `fence`, a string; `tail` as the sidecar made
-- it) into the lock.
local function grant(h, lock, owner, fence, now, ttl, mode, limit, tail)
  local name, value = tail_parts(tail)
  local expiry = now + ttl
  if mode == 'x' and limit == 1 then
    redis.call('SET', h, single('1', fence, tail), 'PX', ttl)
  else
    if not lock.hash then
      -- Nothing or a string (a token kept): a hash from now on.
      redis.call('DEL', h)
    end
    redis.call('HSET', h, 'f', fence, owner, record(1, fence, expiry))
    if lock.n == 0 then
      redis.call('HSET', h, 'm', mode .. int(limit))
    end
    if name ~= '' then
      redis.call('HSET', h, 'n:' .. owner, name)
    end
    if value ~= '' then
      redis.call('HSET', h, 'v:' .. owner, value)
    end
    lock.hash = true
  end
  lock.holders[owner] = {count = 1, fence = fence, expiry = expiry, name = name, value = value}
  lock.n, lock.mode, lock.limit, lock.fence = lock.n + 1, mode, limit, tonumber(fence)
  if lock.hash then
    redis.call('PEXPIREAT', h, last_expiry(lock))
  end
end

-- Whether the lock admits a new holder of this mode and limit: 'free', 'ok' (joins the
-- current holders), 'busy', or 'conflict' (the holders use another limit).
local function admit(lock, mode, limit)
  if lock.n == 0 then
    return 'free'
  end
  if lock.limit ~= limit then
    return 'conflict'
  end
  if limit > 1 then
    if lock.n < limit then
      return 'ok'
    end
    return 'busy'
  end
  if mode == 's' and lock.mode == 's' then
    return 'ok'
  end
  return 'busy'
end

local function parse_waiter(waiter)
  local mode, limit, owner, sid, name = string.match(waiter, '^([xs])|(%d+)|([^|]*)|([^|]*)|(.*)$')
  return mode, tonumber(limit), owner, sid, name
end

-- The fair waiters the lock would admit now, oldest first (at most 64 per call): the
-- head; readers behind a reader head up to the first writer; free permits of a
-- semaphore. A writer at the head stops every reader behind it: no writer starvation.
local function heads(lock, q)
  local room, readers_only = 0, false
  if lock.n == 0 then
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
  elseif lock.limit > 1 then
    room = lock.limit - lock.n
  elseif lock.mode == 's' then
    room, readers_only = 64, true
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

-- Drops waiters whose registration expired (a dead sidecar's), from w and q. Returns
-- how many are left.
local function purge_waiters(w, q, now)
  local gone = redis.call('ZRANGEBYSCORE', w, '-inf', int(now))
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', w, '-inf', int(now))
    redis.call('ZREM', q, unpack(gone))
  end
  return redis.call('ZCARD', w)
end

-- After the lock may have room again (a release, a waiter leaving the queue, a grant
-- that leaves room): wakes the waiters that can now have it, when there are any, with
-- the key then one line per fair waiter to wake (a bare key wakes one unfair waiter per
-- sidecar); watchers re-read on that notice too. Without waiters, tells the watchers.
local function wake(w, q, l, lock, channel, key, sharded, now)
  if redis.call('EXISTS', w) == 0 or purge_waiters(w, q, now) == 0 then
    changed(l, channel, key, sharded)
    return
  end
  local message = key
  for _, owner in ipairs(heads(lock, q)) do
    message = message .. '\n' .. owner
  end
  publish(channel, sharded, message)
end

-- Whether an exclusive lock's string v names owner as its holder (the field after the
-- third '|'). What a renewal asks of every held lock every TTL/3: two plain finds and
-- one substring, where parse_single makes four captures, one of them the whole tail
-- with the holder's value.
local function held_by(v, owner)
  local a = string.find(v, '|', 3, true)
  local b = a and string.find(v, '|', a + 1, true)
  if not b then
    return false
  end
  return string.sub(v, b + 1, b + #owner) == owner and string.byte(v, b + #owner + 1) == 124
end

-- Extends owner's grant of lock h by ttl ms (a string) while it is still held. Returns
-- 1 when renewed, 0 when not held. Two commands for an exclusive lock (its key's TTL is
-- the grant's), three in a hash: renewals run for every held lock every TTL/3.
local function renew_grant(h, owner, ttl, now)
  local ok, v = pcall(redis.call, 'GET', h)
  if ok then
    if not v or string.sub(v, 1, 1) ~= 'x' or not held_by(v, owner) then
      return 0
    end
    redis.call('PEXPIRE', h, ttl)
    return 1
  end
  local okh, r = pcall(redis.call, 'HGET', h, owner)
  if not okh or not r then
    return 0
  end
  local count, fence, expiry = string.match(r, '^(%d+)|(%d+)|(%d+)$')
  if not expiry or tonumber(expiry) <= now then
    return 0
  end
  local until_ms = now + tonumber(ttl)
  redis.call('HSET', h, owner, count .. '|' .. fence .. '|' .. int(until_ms))
  -- GT: only ever extend (another holder may hold the key longer).
  redis.call('PEXPIREAT', h, until_ms, 'GT')
  return 1
end
