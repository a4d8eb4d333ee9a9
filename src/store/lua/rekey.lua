--#include core
-- Moves a resumed session's grant of the lock KEYS[1] from ARGV[1] (its owner under the
-- secret the client presented) to ARGV[2] (its owner under the session's new secret),
-- keeping its count, token, client name and value, and extends it by ARGV[3] ms, as a
-- renewal would. A grant already under ARGV[2] (a call made again) is only extended.
-- A sidecar that still renews or releases under ARGV[1] (it was frozen, not dead) then
-- finds nothing: it is fenced off.
-- Returns {1, count, fence, mode and limit ('x1', 's1', 'x5'), value} when held, {0}
-- when neither owner holds the lock.
local h, old, new, ttl = KEYS[1], ARGV[1], ARGV[2], ARGV[3]

local ok, v = pcall(redis.call, 'GET', h)
if ok then
  if not v or string.sub(v, 1, 1) ~= 'x' then
    return {0}
  end
  local count, fence, tail, holder = parse_single(v)
  if not count or (holder ~= old and holder ~= new) then
    return {0}
  end
  local rest = string.sub(tail, #holder + 1)
  redis.call('SET', h, single(count, fence, new .. rest), 'PX', ttl)
  local len, at = string.match(rest, '^|(%d+)|()')
  local value = ''
  if at then
    value = string.sub(rest, at + tonumber(len))
  end
  return {1, count, fence, 'x1', value}
end

local okh, r = pcall(redis.call, 'HGET', h, old)
if not okh then
  -- A lock of the previous data model: never this session's.
  return {0}
end
local from = old
if not r then
  r = redis.call('HGET', h, new)
  from = new
end
if not r then
  return {0}
end
local count, fence, expiry = string.match(r, '^(%d+)|(%d+)|(%d+)$')
local now = now_ms()
if not expiry or tonumber(expiry) <= now then
  return {0}
end
local until_ms = now + tonumber(ttl)
local name = redis.call('HGET', h, 'n:' .. from)
local value = redis.call('HGET', h, 'v:' .. from)
if from ~= new then
  redis.call('HDEL', h, from, 'n:' .. from, 'v:' .. from)
  if name then
    redis.call('HSET', h, 'n:' .. new, name)
  end
  if value then
    redis.call('HSET', h, 'v:' .. new, value)
  end
end
redis.call('HSET', h, new, count .. '|' .. fence .. '|' .. int(until_ms))
redis.call('PEXPIREAT', h, until_ms, 'GT')
return {1, count, fence, redis.call('HGET', h, 'm') or 'x1', value or ''}
