--#include core
-- Raises the lock's last token to ARGV[1] when it is lower (Redlock: the token of a
-- grant made by a majority is written back, so any later majority, which shares a
-- master with this one, issues a larger one). Where nobody holds the lock, a string
-- keeps the token until this master's clock passes it. Returns the token kept.
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
    local count, fence, tail = parse_single(v)
    if tonumber(fence) >= want then
      return tonumber(fence)
    end
    redis.call('SET', h, single(count, ARGV[1], tail), 'KEEPTTL')
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
