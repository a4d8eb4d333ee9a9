-- Resumes a session's record (its fields and buckets: see record.lua), in two calls around the
-- check of the attachment of the sidecar it names (a key of another slot on a Cluster).
-- ARGV[1] = 'check', ARGV[2] = the secret the client presented: returns the sidecar
--   the record names when the secret's SHA-1 is 't', else false.
-- ARGV[1] = 'claim', then the secret, the new secret, the claiming sidecar and the
--   sidecar 'check' answered: when 't' and 'a' are unchanged, the record becomes the
--   claiming sidecar's under the new secret; returns {1, KEY, LINE, KEY, LINE, ...} for
--   the locks it lists, else {0}.
local r = KEYS[1]
local t = redis.call('HGET', r, 't')
if not t or t ~= redis.sha1hex(ARGV[2]) then
  if ARGV[1] == 'check' then
    return false
  end
  return {0}
end
local a = redis.call('HGET', r, 'a')
if ARGV[1] == 'check' then
  return a or false
end
if a ~= ARGV[5] then
  return {0}
end
redis.call('HSET', r, 't', redis.sha1hex(ARGV[3]), 'a', ARGV[4])
local out = {1}
-- Inline lines (a small record, or one an older sidecar wrote), then the buckets'.
local all = redis.call('HGETALL', r)
local b = 0
for i = 1, #all, 2 do
  if string.sub(all[i], 1, 2) == 'k:' then
    out[#out + 1] = string.sub(all[i], 3)
    out[#out + 1] = all[i + 1]
  elseif all[i] == 'b' then
    b = tonumber(all[i + 1]) or 0
  end
end
for j = 0, b - 1 do
  all = redis.call('HGETALL', r .. ':' .. j)
  for i = 1, #all, 2 do
    out[#out + 1] = all[i]
    out[#out + 1] = all[i + 1]
  end
end
return out
