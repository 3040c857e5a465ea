--[[ Store the outcome of a record the caller still holds, and wake its waiters.
  KEYS[1] record key
  ARGV[1] token, ARGV[2] status ('completed' | 'failed'), ARGV[3] response status,
  ARGV[4] headers (JSON), ARGV[5] body (bytes), ARGV[6] resource id, ARGV[7] '1' when there is
  a resource id, ARGV[8] ttl ms, ARGV[9] grace ms, ARGV[10] notification channel
  Returns 1 when stored, 0 when fenced out (another token, or no longer in progress) ]]
local rk = KEYS[1]
local f = redis.call('HMGET', rk, 'tok', 'st')
if f[1] ~= ARGV[1] or f[2] ~= 'in_progress' then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expiresAt = now + tonumber(ARGV[8])
local ua, ea = string.format('%d', now), string.format('%d', expiresAt)
-- lu stays (readers ignore it once completed) and rid cannot be set yet (a new lifecycle starts
-- from an empty hash): one HSET, no HDEL, as few calls as the server can do it with.
if ARGV[7] == '1' then
  redis.call('HSET', rk, 'st', ARGV[2], 'rs', ARGV[3], 'rh', ARGV[4], 'rb', ARGV[5], 'rid', ARGV[6], 'ua', ua, 'ea', ea)
else
  redis.call('HSET', rk, 'st', ARGV[2], 'rs', ARGV[3], 'rh', ARGV[4], 'rb', ARGV[5], 'ua', ua, 'ea', ea)
end
redis.call('PEXPIREAT', rk, string.format('%d', expiresAt + tonumber(ARGV[9])))
redis.call('PUBLISH', ARGV[10], '1')
return 1
