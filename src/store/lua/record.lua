-- Changes one session's record. KEYS[1] is '{ns:session/SID}:s', a hash: 't' the SHA-1
-- of the session's secret (the secret itself is never kept), 'a' the id of the sidecar
-- the session is attached to, 'c' its client name, and per lock it holds
-- 'k:KEY' -> 'grant number|ttl_ms|fencing token' (mode, limit, count and value are in
-- the lock). Applied only while 't' is this session's secret's: a session resumed
-- elsewhere has a new secret, so the sidecar it left cannot change its record.
-- ARGV: secret sidecar client_name ttl_ms end n_set, then n_set pairs KEY LINE to list,
-- then the KEYs to take off the list. end = '1': the session ended; the record goes.
-- A record that lists no lock goes at once; one this call creates takes 'a' and 'c'.
-- Returns 1 (written, or nothing to do), 0 (the record is another generation's).
local r = KEYS[1]
local t = redis.sha1hex(ARGV[1])
local current = redis.call('HGET', r, 't')
if current and current ~= t then
  return 0
end
if ARGV[5] == '1' then
  if current then
    redis.call('DEL', r)
  end
  return 1
end
local n_set = tonumber(ARGV[6])
if not current then
  if n_set == 0 then
    return 1
  end
  redis.call('HSET', r, 't', t, 'a', ARGV[2], 'c', ARGV[3])
end
local i = 7
for _ = 1, n_set do
  redis.call('HSET', r, 'k:' .. ARGV[i], ARGV[i + 1])
  i = i + 2
end
for j = i, #ARGV do
  redis.call('HDEL', r, 'k:' .. ARGV[j])
end
if redis.call('HLEN', r) <= 3 then
  redis.call('DEL', r)
else
  redis.call('PEXPIRE', r, ARGV[4])
end
return 1
