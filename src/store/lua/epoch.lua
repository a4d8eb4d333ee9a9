-- The store's epoch and tenure (`redis/restarts/`): a marker key, '{ns:epoch}:e' (on a
-- Cluster one per master, '{ns:epoch/N}:e'), that every sidecar reads on each new
-- connection before any other call goes out on it (on a Cluster: on its own connection
-- to each master, before a grant or a renewal goes to that master). It holds
-- 'epoch|hold-off end|known|tenure|witness' and never expires:
-- - epoch: random, written when the marker is made: the marker is gone only when the
--   server lost its data (restarted empty, flushed);
-- - hold-off end: ms in the server's clock; no new grant before it (0: none);
-- - known: '1' when the hold-off was started by a sidecar that found the loss;
-- - tenure: the serving process and its replication history, run_id and master_replid
--   (INFO): both change when the server restarts, from a snapshot or an AOF too, and
--   master_replid when a replica is promoted. A marker that names another tenure was
--   written before the data could have gone back (the last grants may be missing), so
--   nothing is granted for the hold-off while the holders write their grants back;
-- - witness: a shard channel of the marker's slot that every sidecar which read this
--   tenure subscribes on its own connection to the master (Cluster). A restart, a
--   promotion, a demotion or a slot move drops or never had its subscribers, so a grant
--   that reaches a server nobody verified finds no witness (guard.lua) and is refused.
-- ARGV: known (the epoch this sidecar read before, '' for none), a new random epoch, the
-- hold-off in ms, a new random witness suffix, durable ('1': a changed tenure is not
-- taken for data that went back; only a lost marker is).
-- - No marker: written with the new epoch. A sidecar that knew one sees that the server
--   lost its data, so nothing may be granted for the hold-off: any lock held before the
--   loss is re-asserted by its holder meanwhile, or lost to it by its safe deadline.
--   So does a server with a replication history (master_replid2 set: a replica
--   promoted, or a master restarted from a snapshot): the marker, written just before
--   the last grants, may have been lost with them. A sidecar that knew none reaching a
--   server without a history (a new one, or one restarted empty) cannot tell it from
--   one that lost its data: no hold-off, 'known' '0'.
-- - Another tenure (or none: a marker of an older sidecar): the hold-off starts now.
-- - A marker a sidecar that knew none wrote, while this one knew another epoch: the
--   data went and that sidecar came first; the hold-off starts now ('known' '1').
-- A hold-off that starts on a marker also gives it a new witness, so that a sidecar
-- which read the marker before must read it again before its next grant.
-- Returns {epoch, ms of hold-off left (0: none), 1 when this call found a loss (2: the
-- tenure changed), the witness}.
local e = KEYS[1]
local known, fresh, hold, durable = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[5] == '1'
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local server = redis.call('INFO', 'server')
local replication = redis.call('INFO', 'replication')
local tenure = (string.match(server, 'run_id:(%x+)') or '?') .. ':' ..
  (string.match(replication, 'master_replid:(%x+)') or '?')
local before = string.match(replication, 'master_replid2:(%x+)')
local history = before ~= nil and string.find(before, '[^0]') ~= nil
local witness = string.sub(e, 1, -2) .. 'w:' .. ARGV[4]

local function write(epoch, until_ms, knew, w)
  redis.call('SET', e, epoch .. '|' .. string.format('%d', until_ms) .. '|' .. knew .. '|' ..
    tenure .. '|' .. w)
end

local v = redis.call('GET', e)
if not v then
  if known == '' and (durable or not history) then
    write(fresh, 0, '0', witness)
    return {fresh, 0, 0, witness}
  end
  write(fresh, now + hold, '1', witness)
  return {fresh, hold, known == '' and 2 or 1, witness}
end
local epoch, until_ms, knew, rest = string.match(v, '^([^|]*)|(%d+)|([01])(.*)$')
if not epoch then
  return redis.error_reply('ERR the epoch marker ' .. e .. ' is not Lockside\'s')
end
until_ms = tonumber(until_ms)
local was, w = string.match(rest, '^|([^|]*)|(.*)$')
if was ~= tenure then
  if durable then
    write(epoch, until_ms, knew, witness)
    return {epoch, math.max(until_ms - now, 0), 0, witness}
  end
  until_ms = math.max(until_ms, now + hold)
  write(epoch, until_ms, '1', witness)
  return {epoch, until_ms - now, 2, witness}
end
if known ~= '' and known ~= epoch and knew == '0' then
  until_ms = now + hold
  write(epoch, until_ms, '1', witness)
  return {epoch, hold, 1, witness}
end
return {epoch, math.max(until_ms - now, 0), 0, w}
