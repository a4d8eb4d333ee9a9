--#include core
--#include lock
-- Raises the lock's last token to ARGV[1] when it is lower (Redlock: the token of a
-- grant made by a majority is written back, so any later majority, which shares a
-- master with this one, issues a larger one). Where nobody holds the lock, a string
-- keeps the token until this master's clock passes it; where the token would outlive
-- a held grant's key, the lock becomes a hash that keeps it as long. Returns the token
-- kept.
local MAX_KEEP = 86400000
local h = KEYS[1]
local want = tonumber(ARGV[1])
local keep = math.floor(want / 1024) + 1
local ok, v = pcall(redis.call, 'GET', h)
if ok then
  if not v then
    redis.call('SET', h, 'f|' .. ARGV[1] .. '|0', 'PXAT', keep)
    return want
  end
  if string.sub(v, 1, 1) == 'x' then
    local count, fence, tail, owner = parse_single(v)
    if tonumber(fence) >= want then
      return tonumber(fence)
    end
    local expiry = redis.call('PEXPIRETIME', h)
    if keep <= expiry then
      redis.call('SET', h, single(count, ARGV[1], tail), 'KEEPTTL')
      return want
    end
    -- The token would outlive the grant's key: it came from a master whose clock is
    -- ahead of this one's. Forgotten at the grant's expiry, this master would later
    -- help a majority issue smaller tokens. So the lock is kept as a one-permit hash
    -- (the semaphore form, 'x1'), the grant inside with its own expiry, 'f' until this
    -- master's clock passes the token (at most a day: a bound on a wild clock).
    local name, value = tail_parts(tail)
    redis.call('DEL', h)
    redis.call('HSET', h, 'm', 'x1', 'f', ARGV[1], owner, record(count, ARGV[1], expiry))
    if name ~= '' then
      redis.call('HSET', h, 'n:' .. owner, name)
    end
    if value ~= '' then
      redis.call('HSET', h, 'v:' .. owner, value)
    end
    redis.call('PEXPIREAT', h, math.min(keep, now_ms() + MAX_KEEP))
    return want
  end
  local fence, delay = string.match(v, '^f|(%d+)|(%d+)')
  if tonumber(fence) >= want then
    return tonumber(fence)
  end
  redis.call('SET', h, 'f|' .. ARGV[1] .. '|' .. delay, 'PXAT',
    math.max(keep, redis.call('PEXPIRETIME', h)))
  return want
end
local okh, f = pcall(redis.call, 'HGET', h, 'f')
if not okh then
  return 0
end
if tonumber(f or '0') >= want then
  return tonumber(f)
end
redis.call('HSET', h, 'f', ARGV[1])
redis.call('PEXPIREAT', h, keep, 'GT')
return want
