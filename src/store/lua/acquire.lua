-- Grants the lock to the claim's owner when the lock admits its mode and limit, no
-- lock-delay runs, and (fair) nobody queued ahead of it could be granted instead.
-- Otherwise answers busy and, when it waits, registers the waiter for ARGV[1] ms (and
-- queues it, when fair).
-- ARGV: ttl_ms tail claim notice guard ticket
--   tail: 'owner|name length|name' then the value, as the lock's string keeps them.
--   claim: wait fair '|' waiter, e.g. '01|x|1|owner|session_id|client_name'; the waiter
--   ('mode|limit|owner|session_id|client_name') is what w and q keep. A waiting claim
--   (wait = '1') may have registered as a waiter on an earlier try: a grant removes that
--   registration.
--   notice: sharded ('1': SPUBLISH, a Cluster) then the lock's name; its channel is
--   h's name with 'n' for the last letter.
--   guard: '' on one server; on a Cluster 'marker|witness' (guard.lua): no grant on a
--   master whose tenure the sidecar did not read, nor while its hold-off runs.
--   ticket: '' for a request of one key; for one of several keys (AcquireAll) the
--   score its fair queue entry takes on every key, and then a grant keeps the waiter
--   registration (the sidecar removes it once the whole request is granted or ends).
--   A fair queue orders by score; a single key's entry is scored by arrival,
--   max(last + 1, now * 1024), so that both compare. A waiter is behind only those of
--   a strictly smaller score: two requests can never each be ahead of the other.
--   On one server (not a Cluster: another slot), when the claiming session has a
--   record: KEYS[5] the record (record.lua), ARGV[7] the SHA-1 of the session's secret,
--   ARGV[8] the grant's name and ARGV[9] its line without the token, 'grant|ttl_ms'. A
--   grant is then listed in the same call, the token appended, when the record is the
--   session's (its hash matches), keeps its lines inline with room for one more, and
--   lives at least three of this TTL (a longer lock makes the journal write the record
--   with a longer TTL: record.lua's caller); the answer is then the token negated. So
--   a first grant of a key costs no record write and no second round trip before its
--   `Granted` (the journal writes it otherwise). The record is only ever created by the
--   journal: after the attachment.
-- Every argument costs Redis a Lua string on every call (and a table that grows past 4
-- costs another rehash): hence few, the rarely needed parts packed.
-- Returns the fence (a bare integer: a table reply costs Redis more) granted, negated
-- when the record lists it now (above); {0, ms
-- until something may change, queue position, a ticket (the score a claim that comes now
-- would take: now * 1024, and when fair after every one queued)} busy; {2, the
-- holders' limit} when the holders use another limit.
local h = KEYS[1]
local ttl, tail, claim = ARGV[1], ARGV[2], ARGV[3]
-- The answer to a grant of token fence: listed in the session's record when it can be.
local granted = tonumber
if KEYS[5] then
  granted = function(fence)
    local r = KEYS[5]
    local head = redis.call('HMGET', r, 't', 'b')
    -- 't', 'a', 'c' and at most 64 lines inline (record.lua's INLINE): room for one.
    if head[1] ~= ARGV[7] or head[2] or redis.call('HLEN', r) > 66
        or redis.call('PTTL', r) < 3 * tonumber(ARGV[1]) then
      return fence
    end
    redis.call('HSET', r, 'k:' .. ARGV[8], ARGV[9] .. '|' .. string.format('%d', fence))
    return -fence
  end
end
local again, fair = string.sub(claim, 1, 1) == '1', string.sub(claim, 2, 2) == '1'
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
if ARGV[5] ~= '' then
--#include guard
  local until_ms = guarded(ARGV[5])
  if not until_ms then
    return redis.error_reply(UNVERIFIED)
  end
  if until_ms > now then
    return {0, until_ms - now, 0}
  end
end

-- The common case: an exclusive lock nobody holds (no key, or only its last token kept
-- after a release) and no lock-delay runs, for a fair claim with nobody queued: one
-- EXISTS (of the queue and the watchers together: both absent is the common case), one
-- GET and one SET, the token max(last + 1, now * 1024). Every call a script makes costs
-- Redis about a microsecond besides its own work, hence one EXISTS for two keys. It runs
-- before core's and lock's helpers are defined (each a closure made on every call), so
-- it spells out the little it needs of them.
-- Not SET NX PX GET in place of GET and SET: measured (callgrind, Redis 7.0.15) it costs
-- Redis more, over a kept token (which then takes a second SET) and over a missing key
-- alike: about 8,000 instructions more per acquire, of about 70,000.
local others = 0
-- A claim of several keys (a ticket) always takes the full path: it registers even when
-- granted.
local fast = string.sub(claim, 4, 7) == 'x|1|' and ARGV[6] == ''
if fast then
  if fair then
    others = redis.call('EXISTS', KEYS[3], KEYS[4])
    fast = others == 0 or redis.call('EXISTS', KEYS[3]) == 0
  else
    others = redis.call('EXISTS', KEYS[4])
  end
end
if fast then
  local ok, v = pcall(redis.call, 'GET', h)
  local fence = now * 1024
  if ok and v then
    -- A kept token 'f|last|delay end': free once the delay (0: none) has ended.
    local last, until_ms = string.match(v, '^f|(%d+)|(%d+)$')
    if last and tonumber(until_ms) <= now then
      fence = math.max(last + 1, fence)
    else
      ok = false
    end
  end
  if ok then
    redis.call('SET', h, 'x|1|' .. string.format('%d', fence) .. '|' .. tail, 'PX', ttl)
    if again then
      redis.call('ZREM', KEYS[2], string.sub(claim, 4))
    end
    if others > 0 and redis.call('EXISTS', KEYS[4]) == 1 then
      local notice = ARGV[4]
      redis.call(string.sub(notice, 1, 1) == '1' and 'SPUBLISH' or 'PUBLISH',
        string.sub(h, 1, -2) .. 'n', string.sub(notice, 2) .. '\n=')
    end
    return granted(fence)
  end
end

--#include core
--#include lock

local w, q, l = KEYS[2], KEYS[3], KEYS[4]
local waiter = string.sub(claim, 4)
local mode, limit, owner = parse_waiter(waiter)
local sharded, key = string.sub(ARGV[4], 1, 1), string.sub(ARGV[4], 2)
local channel = string.sub(h, 1, -2) .. 'n'


ttl = tonumber(ttl)
local lock = load(h, now)
if not lock then
  -- A v1 lock: held by a sidecar of the previous version until it expires.
  return {0, math.max(redis.call('PTTL', h), 1), 0}
end
purge(h, lock, now)
local state = admit(lock, mode, limit)
if state == 'conflict' then
  return {2, lock.limit}
end
local delayed = lock.delay and lock.delay > now
local go = state ~= 'busy' and not delayed
local ticket = ARGV[6]
-- The fair waiters ahead of this claim: those of a strictly smaller score (all of them
-- when it is not queued yet).
local function ahead_of()
  local mine = redis.call('ZSCORE', q, waiter)
  if not mine then
    return redis.call('ZCARD', q)
  end
  return redis.call('ZCOUNT', q, '-inf', '(' .. mine)
end

if go and fair then
  -- A dead sidecar's waiter must not hold the queue up.
  purge_waiters(w, q, now)
  local ahead = ahead_of()
  if ahead > 0 then
    if limit > 1 then
      go = ahead < limit - lock.n
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

-- Registers the claim as a waiter for ttl (and queues it, when fair): a release then
-- publishes a notice, and a fair claim keeps its place.
-- The score of a claim that comes now: after every one queued, and on the store's clock.
local function next_score()
  local last = redis.call('ZRANGE', q, -1, -1, 'WITHSCORES')
  return math.max((tonumber(last[2]) or 0) + 1, now * 1024)
end

local function register()
  redis.call('ZADD', w, int(now + ttl), waiter)
  if fair and not redis.call('ZSCORE', q, waiter) then
    redis.call('ZADD', q, int(tonumber(ticket) or next_score()), waiter)
  end
  -- Both live until their last registration expires.
  local latest = redis.call('ZRANGE', w, -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', w, latest[2])
  if fair then
    redis.call('PEXPIREAT', q, latest[2])
  end
end

if not go then
  if again then
    register()
  end
  -- Look again when the first holder, the delay, or (fair) the first waiter may be gone.
  local look = now + ttl
  for _, holder in pairs(lock.holders) do
    look = math.min(look, holder.expiry)
  end
  if delayed then
    look = math.min(look, lock.delay)
  end
  local position, offer = 0, now * 1024
  if fair then
    local oldest = redis.call('ZRANGE', w, 0, 0, 'WITHSCORES')
    if #oldest > 0 and oldest[1] ~= waiter then
      look = math.min(look, tonumber(oldest[2]))
    end
    position = ahead_of() + 1
    -- A request for several keys that comes now is behind every one queued here.
    offer = next_score()
  end
  return {0, int(math.max(look - now, 1)), position, int(offer)}
end

-- Fencing token: max(last + 1, store ms * 1024). See next_fence in src/store/mod.rs.
local fence = math.max(lock.fence + 1, now * 1024)
grant(h, lock, owner, int(fence), now, ttl, mode, limit, tail)
if again and ticket ~= '' then
  -- One key of several: its place is kept while the request may still give it back.
  register()
elseif again then
  redis.call('ZREM', w, waiter)
  if fair then
    redis.call('ZREM', q, waiter)
  end
end
if mode == 's' or (limit > 1 and lock.n < limit) then
  -- Room is left for more readers or permits: pass the wake on.
  wake(w, q, l, lock, channel, key, sharded, now)
else
  changed(l, channel, key, sharded)
end
return granted(fence)
