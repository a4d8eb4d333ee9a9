-- Changes one session's record. KEYS[1] is '{ns:session/SID}:s', a hash: 't' the SHA-1
-- of the session's secret (the secret itself is never kept), 'a' the id of the sidecar
-- the session is attached to, 'c' its client name, and its lines, one per lock it
-- holds: KEY -> 'grant number|ttl_ms|fencing token' (mode, limit, count and value are
-- in the lock).
--
-- Where the lines are: a record of up to INLINE lines keeps them in KEYS[1] itself as
-- 'k:KEY' fields (the only layout before, so a record an older sidecar wrote reads the
-- same). A larger one is split into buckets: KEYS[1] gets 'b', the number of buckets B
-- (a power of two), and 'n', the number of lines, and line KEY lives in the hash
-- KEYS[1]..':'..i, i = (first 32 bits of SHA-1(KEY)) mod B, as field KEY. Why: past
-- hash-max-listpack-entries (512 by default) a hash becomes a real dict, about 130 bytes
-- a line, where a listpack costs the line's bytes and a few (about 50): buckets of
-- PER_BUCKET lines on average (a few dozen more in the fullest, well under 128) stay
-- listpacks. B doubles when the lines pass PER_BUCKET * B (each line moves at most once
-- per doubling). A field or line longer than hash-max-listpack-value (64 bytes) makes
-- its own bucket a dict, and only that one. The buckets share KEYS[1]'s hash tag,
-- hence its Cluster slot. A record never goes back to inline lines; it goes whole.
--
-- Expiry: KEYS[1] lives ttl_ms from each write (the journal writes twice the longest
-- lock TTL at least every such TTL, so the record outlives every lock it lists). Its
-- buckets must live at least as long, yet extending every bucket on every write would
-- make each write cost O(B): instead 'e' (a time, Redis' clock, ms) is when every bucket
-- expires. A write that would make KEYS[1] outlive 'e' moves 'e' to 2 * ttl_ms from now
-- and extends every bucket to it (about once per ttl_ms); any other write only sets 'e'
-- on the buckets it wrote to (a new one has no expiry yet). So a bucket outlives the
-- record by at most 2 * ttl_ms; the session's end deletes them all at once.
--
-- Applied only while 't' is this session's secret's: a session resumed elsewhere has a
-- new secret, so the sidecar it left cannot change its record.
-- ARGV: secret sidecar client_name ttl_ms end n_set, then n_set pairs KEY LINE to list,
-- then pairs KEY GRANT to take off the list: KEY's line goes unless it names a later
-- grant than GRANT (one that acquire.lua listed itself while this write was on its way).
-- end = '1': the session ended; the record goes.
-- An 's' after end's letter ('1s', 'ls', '0s'): the session was resumed, and a sidecar
-- it left may still write under an old secret, which must find the record not its own
-- (0) rather than missing. So at the end a spent mark ('t' = '-', which no secret's
-- SHA-1 is) stays for ttl_ms, which no write and no resume opens; and a record whose
-- last line goes is kept, empty, for ttl_ms.
-- end = 'l': the sidecar wrote lines to this record before, so a missing record was
-- lost (expired in an outage, lost in a restart or a failover): nothing is written,
-- and the answer 2 makes the sidecar write every line again, rather than a record of
-- this call's lines alone. A record that lists no lock goes at once; one this call
-- creates takes 'a' and 'c'. A write with no line to list or take off extends the
-- record: it sends no line, so keeping 100,000 locks' records alive costs a call per
-- session per TTL, not a line per lock (every line went again before).
-- Returns 1 (written, or nothing to do), 0 (the record is another generation's), 2 (the
-- record was lost: see 'l').
local INLINE = 64
local PER_BUCKET = 64
local r = KEYS[1]
local t = redis.sha1hex(ARGV[1])
local head = redis.call('HMGET', r, 't', 'b', 'n', 'e')
local current = head[1]
if current and current ~= t then
  return 0
end
local b = tonumber(head[2]) or 0
local n = tonumber(head[3]) or 0

-- Takes line field f of hash x off, unless it names a later grant than n: 1 if taken.
local function unlist(x, f, n)
  local line = redis.call('HGET', x, f)
  if not line or (tonumber(string.match(line, '^(%d+)|')) or 0) > tonumber(n) then
    return 0
  end
  return redis.call('HDEL', x, f)
end

local function bucket_of(key, buckets)
  return tonumber(string.sub(redis.sha1hex(key), 1, 8), 16) % buckets
end

local spent = string.sub(ARGV[5], 2, 2) == 's'
local mode = string.sub(ARGV[5], 1, 1)

local function drop_all()
  redis.call('DEL', r)
  for i = 0, b - 1 do
    redis.call('DEL', r .. ':' .. i)
  end
  if spent then
    redis.call('HSET', r, 't', '-')
    redis.call('PEXPIRE', r, tonumber(ARGV[4]))
  end
end

if mode == '1' then
  if current then
    drop_all()
  end
  return 1
end
local n_set = tonumber(ARGV[6])
if not current then
  if mode == 'l' then
    return 2
  end
  if n_set == 0 then
    return 1
  end
  redis.call('HSET', r, 't', t, 'a', ARGV[2], 'c', ARGV[3])
end

-- Buckets this write wrote to (one it created has no expiry yet).
local touched = {}
local function put(i, key, line)
  touched[i] = true
  return redis.call('HSET', r .. ':' .. i, key, line)
end

-- Runs command cmd on key with the arguments in list, at most 1000 a call (unpack's
-- limit is some thousands).
local function chunked(cmd, key, list)
  for j = 1, #list, 1000 do
    redis.call(cmd, key, unpack(list, j, math.min(j + 999, #list)))
  end
end

-- Moves every line into 'to' buckets (from inline 'k:' fields when b is 0), one HSET
-- per bucket written and one HDEL per bucket read.
local function spread(to)
  -- A bucket the record does not use yet must be empty: one left by an earlier
  -- record of this session id (expired apart from it) must not add its lines.
  for i = b, to - 1 do
    redis.call('DEL', r .. ':' .. i)
  end
  local moves = {}
  local function move(from, gone, key, line)
    local k = bucket_of(key, to)
    if k == from then
      return
    end
    local pairs_to = moves[k]
    if not pairs_to then
      pairs_to = {}
      moves[k] = pairs_to
    end
    pairs_to[#pairs_to + 1] = key
    pairs_to[#pairs_to + 1] = line
    gone[#gone + 1] = key
  end
  if b == 0 then
    local all = redis.call('HGETALL', r)
    local gone = {}
    for j = 1, #all, 2 do
      if string.sub(all[j], 1, 2) == 'k:' then
        move(-1, gone, string.sub(all[j], 3), all[j + 1])
      end
    end
    for j = 1, #gone do
      gone[j] = 'k:' .. gone[j]
    end
    chunked('HDEL', r, gone)
  else
    for i = 0, b - 1 do
      local sub = r .. ':' .. i
      local all = redis.call('HGETALL', sub)
      local gone = {}
      for j = 1, #all, 2 do
        move(i, gone, all[j], all[j + 1])
      end
      chunked('HDEL', sub, gone)
    end
  end
  for k, pairs_to in pairs(moves) do
    touched[k] = true
    chunked('HSET', r .. ':' .. k, pairs_to)
  end
  b = to
  redis.call('HSET', r, 'b', b, 'n', n)
end

local i = 7
if b == 0 then
  for _ = 1, n_set do
    redis.call('HSET', r, 'k:' .. ARGV[i], ARGV[i + 1])
    i = i + 2
  end
  for j = i, #ARGV, 2 do
    unlist(r, 'k:' .. ARGV[j], ARGV[j + 1])
  end
  -- 't', 'a', 'c' and the lines.
  n = redis.call('HLEN', r) - 3
  if n > INLINE then
    local to = 2
    while n > PER_BUCKET * to do
      to = to * 2
    end
    spread(to)
  end
else
  for _ = 1, n_set do
    n = n + put(bucket_of(ARGV[i], b), ARGV[i], ARGV[i + 1])
    i = i + 2
  end
  for j = i, #ARGV, 2 do
    local gone = unlist(r .. ':' .. bucket_of(ARGV[j], b), ARGV[j], ARGV[j + 1])
    if gone == 0 then
      -- An older sidecar that resumed this record may have listed it inline (such
      -- lines are not in 'n').
      unlist(r, 'k:' .. ARGV[j], ARGV[j + 1])
    end
    n = n - gone
  end
  if n > PER_BUCKET * b then
    local to = b * 2
    while n > PER_BUCKET * to do
      to = to * 2
    end
    spread(to)
  else
    redis.call('HSET', r, 'n', n)
  end
end

if n <= 0 and not spent then
  drop_all()
  return 1
end
local ttl = tonumber(ARGV[4])
redis.call('PEXPIRE', r, ttl)
if b > 0 then
  local now = redis.call('TIME')
  now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  local until_ms = tonumber(head[4]) or 0
  local touch = touched
  if now + ttl > until_ms then
    until_ms = now + 2 * ttl
    redis.call('HSET', r, 'e', string.format('%d', until_ms))
    touch = {}
    for j = 0, b - 1 do
      touch[j] = true
    end
  end
  for j in pairs(touch) do
    redis.call('PEXPIREAT', r .. ':' .. j, string.format('%d', until_ms))
  end
end
return 1
