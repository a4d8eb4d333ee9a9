--#include core
--#include lock
-- Writes back a grant the store lost with its data (`redis/restarts/`): while the
-- sidecars hold off new grants after the loss, the holder's sidecar re-asserts each of
-- its grants with its owner, hold count and token, so that its client keeps the lock.
-- Admitted as an acquire would be, among the grants already written back (two readers
-- of one lock both come back; two writers cannot, having never held it together).
-- ARGV: ttl_ms tail grant guard
--   tail: 'owner|name length|name' then the value, as the lock's string keeps them.
--   grant: 'mode|limit|count|fence'.
--   guard: the server's marker, with the witness on a Cluster (guard.lua): a grant is
--   written back only on a server that holds new grants off, so never on one that did
--   not lose its data (where a missing grant was released or expired).
-- Returns 1 when the grant is held again (or still was), 0 when the lock admits it not
-- or no hold-off runs there; UNVERIFIED on a master whose tenure was not read.
--#include guard
local h = KEYS[1]
local ttl, tail = tonumber(ARGV[1]), ARGV[2]
local mode, limit, count, fence = string.match(ARGV[3], '^([xs])|(%d+)|(%d+)|(%d+)$')
if not mode then
  return redis.error_reply('ERR reassert: bad grant')
end
limit = tonumber(limit)
local owner = string.match(tail, '^([^|]*)|')
local now = now_ms()
local until_ms = guarded(ARGV[4])
if not until_ms then
  return redis.error_reply(UNVERIFIED)
end
if until_ms <= now then
  return 0
end
local lock = load(h, now)
if not lock then
  return 0
end
purge(h, lock, now)
if lock.holders[owner] then
  return renew_grant(h, owner, ARGV[1], now)
end
local admitted = admit(lock, mode, limit)
if lock.delay or (admitted ~= 'free' and admitted ~= 'ok') then
  return 0
end
-- Tokens only increase: a lock that kept a later token than this grant's keeps it.
local last = lock.fence
grant(h, lock, owner, fence, now, ttl, mode, limit, tail)
if mode == 'x' and limit == 1 then
  if count ~= '1' then
    redis.call('SET', h, single(count, fence, tail), 'PX', ttl)
  end
else
  redis.call('HSET', h, owner, record(count, fence, now + ttl))
  if last > tonumber(fence) then
    redis.call('HSET', h, 'f', int(last))
  end
end
return 1
