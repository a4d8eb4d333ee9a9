-- Raises the fencing counter to ARGV[1] when it is lower (Redlock: the token of a grant
-- made by a majority is written back, so any later majority, which shares a master
-- with this one, issues a larger token). Returns the counter.
local f = KEYS[3]
local fence = tonumber(ARGV[1])
local last = tonumber(redis.call('GET', f) or '0')
if fence > last then
  redis.call('SET', f, int(fence))
  return fence
end
return last
