--[[ Extend the lease of a record the caller still holds.
  KEYS[1] record key, KEYS[2] its steps
  ARGV[1] token, ARGV[2] lease ms, ARGV[3] abandoned retention ms, ARGV[4] grace ms
  Returns 1 when renewed, 0 when fenced out (another token, or no longer in progress) ]]
local rk = KEYS[1]
local v = redis.pcall('GET', rk)
if type(v) == 'table' then return v end -- WRONGTYPE: the key holds another type
if not v or v == WATCH_MARKER then return 0 end
local now = now_ms()
local lockedUntil = now + tonumber(ARGV[2])
return relock(rk, KEYS[2], absolute(rk, v), ARGV[1], now, lockedUntil, lockedUntil + tonumber(ARGV[3]), tonumber(ARGV[4]))
