--#include core
-- Sets ARGV[1]'s hold count to ARGV[2] (at least 1) and extends its grant to ARGV[3] ms
-- from now (never shortens it). The count is the one the session wants, not "one
-- more": a retried or timed-out hold that ran leaves the same count (the session is the
-- authority; the store mirrors it).
-- ARGV: owner count ttl_ms channel key sharded guard
-- Returns the count set, or -1 when ARGV[1] does not hold the lock; UNVERIFIED on a
-- Cluster master whose tenure the sidecar did not read (guard.lua).
--#include guard
if not guarded(ARGV[7]) then
  return redis.error_reply(UNVERIFIED)
end
local h, l = KEYS[1], KEYS[4]
local owner, want, ttl = ARGV[1], string.format('%d', math.max(tonumber(ARGV[2]), 1)), ARGV[3]
local before
local single_lock, count, fence, tail = own_single(h, owner)
if single_lock then
  if not count then
    return -1
  end
  if count ~= want then
    redis.call('SET', h, single(want, fence, tail), 'KEEPTTL')
  end
  redis.call('PEXPIRE', h, ttl, 'GT')
  before = count
else
  local okh, r = pcall(redis.call, 'HGET', h, owner)
  if not okh or not r then
    return -1
  end
  local count, fence, expiry = string.match(r, '^(%d+)|(%d+)|(%d+)$')
  local now = now_ms()
  if not expiry or tonumber(expiry) <= now then
    return -1
  end
  local until_ms = math.max(tonumber(expiry), now + tonumber(ttl))
  redis.call('HSET', h, owner, want .. '|' .. fence .. '|' .. int(until_ms))
  redis.call('PEXPIREAT', h, until_ms, 'GT')
  before = count
end
if before ~= want then
  changed(l, ARGV[4], ARGV[5], ARGV[6])
end
return tonumber(want)
