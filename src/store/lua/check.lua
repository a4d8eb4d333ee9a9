-- The permission check (`redis/checks.rs`): for each command Lockside sends or its
-- scripts call, whether this connection's user may run it on Lockside's keys and
-- channels, asked of the server's ACL without running it (redis.acl_check_cmd,
-- Redis 7.0 and later). A script's own commands need the same permissions as the
-- script's caller, so they are checked here one by one.
-- KEYS[1]: a lock's key (routes the check on a Cluster; nothing is read or written).
-- ARGV: one group per command: its name, its number of words, then the words (the
-- command and arguments shaped as Lockside sends them).
-- Returns the names of the commands the user may not run (or the server does not
-- know), or 0 when the server cannot tell (before Redis 7.0).
if not redis.acl_check_cmd then
  return 0
end
local denied = {}
local i = 1
while i <= #ARGV do
  local name, n = ARGV[i], tonumber(ARGV[i + 1])
  local ok, allowed = pcall(redis.acl_check_cmd, unpack(ARGV, i + 2, i + 1 + n))
  if not ok or not allowed then
    denied[#denied + 1] = name
  end
  i = i + 2 + n
end
return denied
