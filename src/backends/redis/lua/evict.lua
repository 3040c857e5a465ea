--[[ Delete a record whatever its state (an operator's reset) and its steps, and wake its waiters.
  KEYS[1] record key, KEYS[2] its steps
  ARGV[1] notification channel
  Returns 1 when a record existed, 0 when not (a watch marker alone is no record, and stays) ]]
local v = redis.pcall('GET', KEYS[1])
if v == WATCH_MARKER then return 0 end
local n = redis.call('DEL', KEYS[1])
redis.call('DEL', KEYS[2])
if n == 1 then redis.call('PUBLISH', ARGV[1], '1') end
return n
