--#include core
-- Moves a resumed session's grant of the lock KEYS[1] from its owner under the secret
-- the client presented to its owner under the session's new secret, keeping its count,
-- token, client name and value, and extends it by ARGV[3] ms, as a renewal would. A
-- grant already under the new secret (a call made again) is only extended.
-- ARGV: the owner prefix under the old secret ('session_id.secret.'), under the new
-- one, ttl_ms, the grant number the record's line names, the holder inside the session
-- ('' for the session itself).
-- The line may name an earlier grant of the same name (it is rewritten in the
-- background once the key is granted again): the session's grant is found by its
-- owner's prefix (in a hash, the one whose client name ends with this holder), and its
-- own number kept. A sidecar that still renews or releases under the old secret (it was
-- frozen, not dead) then finds nothing: it is fenced off.
-- Returns {1, count, fence, mode and limit ('x1', 's1', 'x5'), value, grant number}
-- when held, {0} when no owner of the session holds the lock.
local h, old, new, ttl, hint, holder = KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

-- The grant number of a session's owner token, under either secret; nil if not one.
local function number(owner)
  for _, prefix in ipairs({old, new}) do
    if string.sub(owner, 1, #prefix) == prefix then
      return string.match(string.sub(owner, #prefix + 1), '^(%d+)$')
    end
  end
  return nil
end

local ok, v = pcall(redis.call, 'GET', h)
if ok then
  if not v or string.sub(v, 1, 1) ~= 'x' then
    return {0}
  end
  local count, fence, tail, owner = parse_single(v)
  local n = count and number(owner)
  if not n then
    return {0}
  end
  local rest = string.sub(tail, #owner + 1)
  redis.call('SET', h, single(count, fence, new .. n .. rest), 'PX', ttl)
  local len, at = string.match(rest, '^|(%d+)|()')
  local value = ''
  if at then
    value = string.sub(rest, at + tonumber(len))
  end
  return {1, count, fence, 'x1', value, n}
end

-- A hash: the hinted owners first, else the session's owner whose name ends with the
-- holder (its client name, then NUL and the holder when not the session's own).
local okh, r = pcall(redis.call, 'HGET', h, old .. hint)
if not okh then
  -- A lock of the previous data model: never this session's.
  return {0}
end
local from = old .. hint
if not r then
  from = new .. hint
  r = redis.call('HGET', h, from)
end
if not r then
  from = nil
  local all = redis.call('HGETALL', h)
  for i = 1, #all, 2 do
    local field = all[i]
    if number(field) then
      local shown = redis.call('HGET', h, 'n:' .. field) or ''
      local nul = string.find(shown, '\0', 1, true)
      local its = nul and string.sub(shown, nul + 1) or ''
      if its == holder then
        from, r = field, all[i + 1]
        break
      end
    end
  end
end
if not r then
  return {0}
end
local n = number(from)
local to = new .. n
local count, fence, expiry = string.match(r, '^(%d+)|(%d+)|(%d+)$')
local now = now_ms()
if not expiry or tonumber(expiry) <= now then
  return {0}
end
local until_ms = now + tonumber(ttl)
local name = redis.call('HGET', h, 'n:' .. from)
local value = redis.call('HGET', h, 'v:' .. from)
if from ~= to then
  redis.call('HDEL', h, from, 'n:' .. from, 'v:' .. from)
  if name then
    redis.call('HSET', h, 'n:' .. to, name)
  end
  if value then
    redis.call('HSET', h, 'v:' .. to, value)
  end
end
redis.call('HSET', h, to, count .. '|' .. fence .. '|' .. int(until_ms))
redis.call('PEXPIREAT', h, until_ms, 'GT')
return {1, count, fence, redis.call('HGET', h, 'm') or 'x1', value or '', n}
