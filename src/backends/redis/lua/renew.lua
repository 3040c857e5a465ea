--[[ Extend the lease of a record the caller still holds.
  KEYS[1] record key, KEYS[2] its steps
  ARGV[1] token, ARGV[2] lease ms, ARGV[3] abandoned retention ms, ARGV[4] grace ms
  Returns 1 when renewed, 0 when fenced out (another token, or no longer in progress) ]]
local rk = KEYS[1]
local v = redis.pcall('GET', rk)
if type(v) == 'table' then
  if redis.call('TYPE', rk)['ok'] ~= 'hash' then return v end
  -- A record of the round-1 layout (a hash), renewed as round 1 did.
  if not legacy_held(rk, ARGV[1]) then return 0 end
  local now = now_ms()
  local lockedUntil = now + tonumber(ARGV[2])
  local expiresAt = lockedUntil + tonumber(ARGV[3])
  redis.call('HSET', rk, 'lu', int(lockedUntil), 'ua', int(now), 'ea', int(expiresAt))
  redis.call('PEXPIREAT', rk, int(expiresAt + tonumber(ARGV[4])))
  return 1
end
if not v or v == 'ik110w' then return 0 end
local now = now_ms()
local lockedUntil = now + tonumber(ARGV[2])
return relock(rk, KEYS[2], absolute(rk, v), ARGV[1], now, lockedUntil, lockedUntil + tonumber(ARGV[3]), tonumber(ARGV[4]))
