--[[ Extend the lease of a record the caller still holds.
  KEYS[1] record key
  ARGV[1] token, ARGV[2] lease ms, ARGV[3] abandoned retention ms, ARGV[4] grace ms
  Returns 1 when renewed, 0 when fenced out (another token, or no longer in progress) ]]
local rk = KEYS[1]
local f = redis.call('HMGET', rk, 'tok', 'st')
if f[1] ~= ARGV[1] or f[2] ~= 'in_progress' then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lockedUntil = now + tonumber(ARGV[2])
local expiresAt = lockedUntil + tonumber(ARGV[3])
redis.call('HSET', rk, 'lu', string.format('%d', lockedUntil), 'ua', string.format('%d', now),
  'ea', string.format('%d', expiresAt))
redis.call('PEXPIREAT', rk, string.format('%d', expiresAt + tonumber(ARGV[4])))
return 1
