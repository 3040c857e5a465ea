--[[ End the lease of a record the caller still holds, so the next acquire runs afresh; wake waiters.
  KEYS[1] record key, KEYS[2] its steps
  ARGV[1] token, ARGV[2] abandoned retention ms, ARGV[3] grace ms, ARGV[4] notification channel
  Returns 1 when released, 0 when fenced out (another token, or no longer in progress)
  PUBLISH only when an in_progress answer or a watch flagged waiters. ]]
local rk = KEYS[1]
local v = redis.pcall('GET', rk)
if type(v) == 'table' then return v end -- WRONGTYPE: the key holds another type
if not v or v == WATCH_MARKER then return 0 end
v = absolute(rk, v)
local now = now_ms()
local done = relock(rk, KEYS[2], v, ARGV[1], now, now, now + tonumber(ARGV[2]), tonumber(ARGV[3]))
-- Waiters are woken only when someone waits (the w flag).
if done == 1 and string.sub(v, 4, 4) == '1' then redis.call('PUBLISH', ARGV[4], '1') end
return done
