-- Removes the waiter ARGV[1] (its wait timed out or was cancelled) from w and q.
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
return 0
