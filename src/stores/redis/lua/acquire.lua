--[[ Acquire a record: take it when no live record holds it, else say why not. One atomic step.
  KEYS[1] record key (a hash)
  ARGV[1] scope, ARGV[2] key, ARGV[3] fingerprint (hex), ARGV[4] lease ms,
  ARGV[5] abandoned retention ms, ARGV[6] grace ms (how long the key outlives expires_at)
  Returns {1, token}                      acquired
          {2, lockedUntilMs}              in progress (live lease, same fingerprint)
          {3, nowMs, field, value, ...}   replay: the whole completed/failed hash
          {4}                             mismatch (live record, other fingerprint)
  Raises 'IDEMKEY_FOREIGN ...' when the key holds a hash idemkey did not write,
  and Redis raises WRONGTYPE when it holds another type. Time is the server's (TIME). ]]
local rk = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[4])
local retention = tonumber(ARGV[5])
local grace = tonumber(ARGV[6])
local function int(n) return string.format('%d', n) end

local f = redis.call('HMGET', rk, 's', 'k', 'fp', 'st', 'tok', 'lu', 'ea', 'att')
local tok, lu, ea, att = tonumber(f[5]), tonumber(f[6]), tonumber(f[7]), tonumber(f[8])
local st = f[4]
-- A new key finds no field; only then is EXISTS needed, to tell it from a hash without ours.
local present = f[1] ~= false or redis.call('EXISTS', rk) == 1
if present then
  local known = st == 'in_progress' or st == 'completed' or st == 'failed'
  if f[1] ~= ARGV[1] or f[2] ~= ARGV[2] or not known or not tok or not ea or not att or (st == 'in_progress' and not lu) then
    return redis.error_reply('IDEMKEY_FOREIGN the key holds a hash that is not an idemkey record of this scope and key')
  end
end

local lockedUntil = now + lease
local expiresAt = lockedUntil + retention

if not present or ea <= now then
  -- Absent, or expired but not yet dropped by Redis: a new lifecycle. The token continues, so a
  -- zombie holder of the old one stays fenced out.
  local token = (tok or 0) + 1
  if present then redis.call('DEL', rk) end
  redis.call('HSET', rk, 's', ARGV[1], 'k', ARGV[2], 'fp', ARGV[3], 'st', 'in_progress', 'tok', int(token),
    'lu', int(lockedUntil), 'att', '1', 'ca', int(now), 'ua', int(now), 'ea', int(expiresAt))
  redis.call('PEXPIREAT', rk, int(expiresAt + grace))
  return {1, token}
end

if st ~= 'in_progress' or lu > now then
  if f[3] ~= ARGV[3] then return {4} end
  if st == 'in_progress' then return {2, lu} end
  local all = redis.call('HGETALL', rk)
  table.insert(all, 1, int(now))
  table.insert(all, 1, 3)
  return all
end

-- Takeover: the holder's lease ended (it crashed, or released a transient failure).
redis.call('HSET', rk, 'fp', ARGV[3], 'tok', int(tok + 1), 'att', int(att + 1), 'lu', int(lockedUntil),
  'ua', int(now), 'ea', int(expiresAt))
redis.call('PEXPIREAT', rk, int(expiresAt + grace))
return {1, tok + 1}
