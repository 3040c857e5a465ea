--[[ End the lease of a record the caller still holds, so the next acquire runs afresh; wake waiters.
  KEYS[1] record key, KEYS[2] its steps
  ARGV[1] token, ARGV[2] abandoned retention ms, ARGV[3] grace ms, ARGV[4] notification channel
  Returns 1 when released, 0 when fenced out (another token, or no longer in progress)
  PUBLISH only when an in_progress answer or a watch flagged waiters. ]]
local rk = KEYS[1]
local v = redis.pcall('GET', rk)
if type(v) == 'table' then
  if redis.call('TYPE', rk)['ok'] ~= 'hash' then return v end
  -- A record of the round-1 layout (a hash), released as round 1 did.
  if not legacy_held(rk, ARGV[1]) then return 0 end
  local now = now_ms()
  local expiresAt = now + tonumber(ARGV[2])
  redis.call('HSET', rk, 'lu', int(now), 'ua', int(now), 'ea', int(expiresAt))
  redis.call('PEXPIREAT', rk, int(expiresAt + tonumber(ARGV[3])))
  redis.call('PUBLISH', ARGV[4], '1')
  return 1
end
if not v or v == 'ik110w' then return 0 end
v = absolute(rk, v)
local now = now_ms()
local done = relock(rk, KEYS[2], v, ARGV[1], now, now, now + tonumber(ARGV[2]), tonumber(ARGV[3]))
-- Waiters are woken only when someone waits (the w flag).
if done == 1 and string.sub(v, 4, 4) == '1' then redis.call('PUBLISH', ARGV[4], '1') end
return done
