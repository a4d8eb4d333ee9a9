-- The guard of a call (`redis/restarts/witness.rs`), included where a script checks it:
-- 'marker|witness', the epoch marker of the master that serves the call's slot (on a
-- Cluster a key of another slot on the same node: scripts without a shebang may read
-- it) and the witness that the sidecar subscribed to there after reading the marker
-- (epoch.lua); on one server 'marker|' (the marker only: every connection there reads
-- it first, and reaches one server process), or '' for no check at all.
-- guarded(guard) returns the hold-off's end (ms in this server's clock, 0: none) when the
-- call may go on; nil when nobody verified this server's tenure under that witness: it
-- restarted, was promoted, or took the slot over since, and may lack the last grants.
-- The caller then answers UNVERIFIED (the sidecar reads the marker again) and changes
-- nothing.
local function guarded(guard)
  if guard == '' then
    return 0
  end
  local marker, witness = string.match(guard, '^(.-)|(.*)$')
  local v = redis.call('GET', marker)
  if not v then
    return nil
  end
  if witness ~= '' then
    if string.sub(v, -#witness - 1) ~= '|' .. witness then
      return nil
    end
    if redis.call('PUBSUB', 'SHARDNUMSUB', witness)[2] == 0 then
      return nil
    end
  end
  return tonumber(string.match(v, '^[^|]*|(%d+)|')) or 0
end

local UNVERIFIED = 'UNVERIFIED the tenure of this server was not read under that witness'
