-- Removes ARGV[1]'s waiter registration (its wait timed out or was cancelled).
redis.call('ZREM', KEYS[4], ARGV[1])
return 0
