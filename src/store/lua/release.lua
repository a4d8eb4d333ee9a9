-- Leaves hold's count N of holds on ARGV[1]'s grant: N > 0 sets the hold count to N
-- (the count the session keeps, so a retried release that ran leaves the same count);
-- 0 releases the grant. When the grant goes, wakes the waiters that can now have the
-- lock (see wake in lock.lua); with a lock-delay > 0 ms and an exclusive lock now free,
-- starts a lock-delay.
-- A lock nobody holds keeps only its last token, until the released grant's expiry (or
-- longer, while a lock-delay runs); then no key is left.
-- ARGV: owner fence hold notice
--   fence: the token the session was granted, or '' when the caller does not know it.
--   Only a hint for the one-call release below: the answer is the same when it is
--   wrong (a Redlock master may keep a larger token than the grant's).
--   hold: the count to leave and the lock-delay in ms, 'count|delay_ms' ('0|0': a
--   whole release without lock-delay, the common case).
--   notice: sharded ('1': SPUBLISH, a Cluster) then the lock's name; its channel is
--   h's name with 'n' for the last letter.
-- Four arguments, the rarely needed ones packed: see acquire.lua.
-- Returns the holds left (0: released), or -1 when ARGV[1] does not hold the lock.
local h, w, l = KEYS[1], KEYS[2], KEYS[4]
local owner, hint, hold = ARGV[1], ARGV[2], ARGV[3]
local gone

-- The most common case, a whole release of an exclusive lock without lock-delay whose
-- token the session knows, in one write: SET ... KEEPTTL GET writes the kept token and
-- answers what was there, and only then do we check that it was this owner's grant.
-- Every call a script makes costs Redis about a microsecond besides its own work, and
-- this saves the GET before the SET. When it was not this owner's grant (rare: a
-- release after the grant expired, was lost or was never made), what was there is put
-- back exactly: another string (a holder's grant, a kept token) with its value and,
-- by KEEPTTL twice, its TTL untouched; no key at all by deleting the one the SET made
-- (KEEPTTL on a missing key makes a key without TTL, which must not stay). A hash
-- (shared lock, semaphore) or a v1 zset answers WRONGTYPE and is left unchanged: the
-- general path below reads it. All of it runs in one script: nobody sees the
-- in-between state, and a replica receives the same writes in one transaction.
-- It runs before core's helpers are defined (each a closure made on every call), and
-- recognises the usual grant, 'x|1|hint|owner|...', by its beginning rather than by
-- a pattern (a pattern and its captures cost Redis more than the rest of the check).
if hold == '0|0' and hint ~= '' then
  local ok, v = pcall(redis.call, 'SET', h, 'f|' .. hint .. '|0', 'KEEPTTL', 'GET')
  if ok then
    local fence = hint
    if v then
      local usual = 'x|1|' .. hint .. '|' .. owner .. '|'
      if string.sub(v, 1, #usual) ~= usual then
        -- Another hold count or another token (Redlock's write-back), another holder,
        -- or a kept token.
        local _, kept, _, holder = string.match(v, '^x|(%d+)|(%d+)|(([^|]*).*)$')
        fence = holder == owner and kept or nil
      end
    end
    if not v or not fence then
      if v then
        redis.call('SET', h, v, 'KEEPTTL')
      else
        redis.call('DEL', h)
      end
      return -1
    end
    if fence ~= hint then
      -- The store kept another token for this grant (Redlock's write-back): keep that.
      redis.call('SET', h, 'f|' .. fence .. '|0', 'KEEPTTL')
    end
    if redis.call('EXISTS', w, l) == 0 then
      return 0
    end
    gone = {holders = {}, n = 0, fence = tonumber(fence), limit = 0}
  end
end

--#include core

local q = KEYS[3]
local left, delay = string.match(hold, '^(%d+)|(%d+)$')
local sharded, key = string.sub(ARGV[4], 1, 1), string.sub(ARGV[4], 2)
local channel = string.sub(h, 1, -2) .. 'n'

-- The common case: an exclusive lock. Its key's TTL is the grant's: a key that exists
-- holds a live grant.
local single_lock, count, fence, tail = false
if not gone then
  single_lock, count, fence, tail = own_single(h, owner)
end
if single_lock then
  if not count then
    return -1
  end
  if left ~= '0' then
    if left ~= count then
      redis.call('SET', h, single(left, fence, tail), 'KEEPTTL')
      changed(l, channel, key, sharded)
    end
    return tonumber(left)
  end
  -- The token stays until the grant's expiry, when the clock has long passed it (1024
  -- tokens a millisecond would be needed to outrun a TTL of a second), so Describe
  -- still shows it and a next grant still goes beyond it; then nothing is left.
  if delay == '0' then
    redis.call('SET', h, 'f|' .. fence .. '|0', 'KEEPTTL')
  else
    local t = redis.call('TIME')
    local until_ms = t[1] * 1000 + math.floor(t[2] / 1000) + tonumber(delay)
    redis.call('SET', h, 'f|' .. fence .. '|' .. string.format('%d', until_ms), 'PXAT',
      math.max(until_ms, redis.call('PEXPIRETIME', h)))
  end
  if redis.call('EXISTS', w, l) == 0 then
    return 0
  end
  gone = {holders = {}, n = 0, fence = tonumber(fence), limit = 0}
end

--#include lock

local now = now_ms()
if not gone then
  -- A shared lock or a semaphore (a hash), or a v1 lock (not ours).
  local lock = load(h, now)
  if not lock or not lock.holders[owner] then
    return -1
  end
  local mine = lock.holders[owner]
  if mine.expiry <= now then
    purge(h, lock, now)
    return -1
  end
  left = tonumber(left)
  if left > 0 then
    if left ~= mine.count then
      redis.call('HSET', h, owner, record(left, mine.fence, mine.expiry))
      changed(l, channel, key, sharded)
    end
    return left
  end
  local latest = last_expiry(lock)
  lock.holders[owner] = nil
  lock.n = lock.n - 1
  redis.call('HDEL', h, owner, 'n:' .. owner, 'v:' .. owner)
  purge(h, lock, now)
  if lock.n == 0 and lock.hash then
    -- Lock-delay is for exclusive locks only.
    rest(h, lock, now, 0, latest)
  end
  gone = lock
end
wake(w, q, l, gone, channel, key, sharded, now)
return 0
