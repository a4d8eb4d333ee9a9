-- The store's epoch (`redis/restarts/`): a marker key, '{ns:epoch}:e' (on a Cluster one
-- per master, '{ns:epoch/N}:e'), that every sidecar reads on each new connection before
-- any other call goes out on it (on a Cluster: after a node's connection dropped, before
-- the next grant). It holds 'epoch|hold-off end|known' and never expires, so it is gone
-- only when the server lost its data: restarted empty (no persistence), or flushed.
-- ARGV: known (the epoch this sidecar read before, '' for none), a new random epoch, the
-- hold-off in ms.
-- - No marker: written with the new epoch. A sidecar that knew one sees that the server
--   lost its data, so nothing may be granted for the hold-off: any lock held before the
--   loss is re-asserted by its holder meanwhile, or lost to it by its safe deadline.
--   A sidecar that knew none (its first connection) cannot tell a new server from one
--   that lost its data: no hold-off, 'known' '0'.
-- - A marker a sidecar that knew none wrote, while this one knew another epoch: the
--   data went and that sidecar came first; the hold-off starts now ('known' '1').
-- Returns {epoch, ms of hold-off left (0: none), 1 when this call found the loss}.
local e = KEYS[1]
local known, fresh, hold = ARGV[1], ARGV[2], tonumber(ARGV[3])
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local v = redis.call('GET', e)
if not v then
  if known == '' then
    redis.call('SET', e, fresh .. '|0|0')
    return {fresh, 0, 0}
  end
  redis.call('SET', e, fresh .. '|' .. string.format('%d', now + hold) .. '|1')
  return {fresh, hold, 1}
end
local epoch, until_ms, knew = string.match(v, '^(.*)|(%d+)|([01])$')
if not epoch then
  return redis.error_reply('ERR the epoch marker ' .. e .. ' is not Lockside\'s')
end
until_ms = tonumber(until_ms)
if known ~= '' and known ~= epoch and knew == '0' then
  until_ms = now + hold
  redis.call('SET', e, epoch .. '|' .. string.format('%d', until_ms) .. '|1')
  return {epoch, hold, 1}
end
return {epoch, math.max(until_ms - now, 0), 0}
