-- The prelude of every Lockside script (`--#include core`).
--
-- The keys of one lock K in namespace ns, all under the hash tag {ns:K}, so they share
-- a Cluster slot:
--   KEYS[1] h  the lock, in one of three forms:
--              - a string 'x|count|fence|owner|name length|name' followed by the
--                holder's value: an exclusive lock (limit 1) and its one holder; the
--                key's own TTL is the grant's. The common case: one key, one SET.
--                'name' (here, in 'n:'..OWNER and in waiters) is the client's name,
--                then NUL and the holder inside the session when the grant is not the
--                session's own: the sidecar makes it, Describe splits it.
--              - a string 'f|fence|delay end': nobody holds it, but its last token is
--                ahead of the clock or a lock-delay runs; PXAT when that ends.
--              - a hash, for shared locks and semaphores: 'm' the holders' mode and limit
--                ('s1' shared, 'x5' a semaphore of 5), 'f' the last token, and per
--                grant OWNER -> 'count|fence|expiry', 'n:'..OWNER -> its client name
--                and 'v:'..OWNER -> its value (only when not empty); PXAT the latest
--                expiry.
--              A lock nobody holds and nothing protects has no key at all: nothing is
--              left behind. A zset here is a lock of the previous data model (v1): it
--              reads as held until it expires (v1 sidecars fail with WRONGTYPE on these
--              forms), so a rolling upgrade never grants a lock twice.
--   KEYS[2] w  zset  waiters ('mode|limit|owner|session_id|client_name') -> the expiry
--                    of the registration.
--   KEYS[3] q  zset  fair waiters -> arrival number.
--   KEYS[4] l  zset  watching sidecars -> the expiry of the registration.
-- A release publishes a notice on the key's channel only while w or l exists; any other
-- change (a grant, a hold count, a value) only while l exists.
-- An OWNER is 'session_id.secret.n': Describe shows the part before the first '.'.
-- Only the store's clock (TIME) is written into Redis; sidecar clocks never are.
-- Numbers are written with int(): tostring() would print 1.8e+15.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function int(n)
  return string.format('%d', n)
end

-- Notices go to the channel the sidecar names: the key's own '{ns:K}:n', by SPUBLISH
-- on a Cluster (sharded = '1'), so only the sidecars that listen hear them.
local function publish(channel, sharded, message)
  redis.call(sharded == '1' and 'SPUBLISH' or 'PUBLISH', channel, message)
end

-- After a change that frees nothing (a grant, a hold count, a value): tells the
-- watchers, when there are any. '=' on the second line: re-read, do not try.
local function changed(l, channel, key, sharded)
  if redis.call('EXISTS', l) == 1 then
    publish(channel, sharded, key .. '\n=')
  end
end

-- An exclusive lock's string: its holder's count and token (strings), then the tail
-- the sidecar makes: 'owner|name length|name' and the value.
local function single(count, fence, tail)
  return 'x|' .. count .. '|' .. fence .. '|' .. tail
end

-- Reads an exclusive lock's string: count and token (strings), the tail, the owner.
local function parse_single(v)
  return string.match(v, '^x|(%d+)|(%d+)|(([^|]*).*)$')
end

-- Reads h as OWNER's exclusive grant. false: h is not a string (a hash: a shared lock or
-- a semaphore, which the caller reads as such); true alone: no grant of OWNER's there
-- (no key, a kept token, another holder); true, count, token and tail: OWNER's grant.
local function own_single(h, owner)
  local ok, v = pcall(redis.call, 'GET', h)
  if not ok then
    return false
  end
  if not v or string.sub(v, 1, 1) ~= 'x' then
    return true
  end
  local count, fence, tail, holder = parse_single(v)
  if holder ~= owner then
    return true
  end
  return true, count, fence, tail
end
