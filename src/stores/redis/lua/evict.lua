--[[ Delete a record whatever its state (an operator's reset) and wake its waiters.
  KEYS[1] record key
  ARGV[1] notification channel
  Returns 1 when a record existed, 0 when not ]]
local n = redis.call('DEL', KEYS[1])
if n == 1 then redis.call('PUBLISH', ARGV[1], '1') end
return n
