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
v = absolute(rk, v)
local head, st, tok, att, ca, p = string.match(v, '^(ik1[01][01])([pcf])|(%d+)|%d+|(%d+)|(%d+)|%d+|%d+|()')
if not st then return unparsable(v) end
if tok ~= ARGV[1] or st ~= 'p' then return 0 end
local now = now_ms()
local lockedUntil = now + tonumber(ARGV[2])
local expiresAt = lockedUntil + tonumber(ARGV[3])
local px = int(expiresAt + tonumber(ARGV[4]) - now)
redis.call('SET', rk, head .. 'p|' .. tok .. '|' .. int(lockedUntil) .. '|' .. att .. '|' .. ca .. '|' .. int(now) .. '|' ..
  int(expiresAt) .. '|' .. string.sub(v, p), 'PX', px)
if string.sub(head, 5, 5) == '1' then redis.call('PEXPIRE', KEYS[2], px) end
return 1
