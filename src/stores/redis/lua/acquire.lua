--[[ Acquire a record: take it when no live record holds it, else say why not. One atomic step.
  KEYS[1] record key (a hash)
  ARGV[1] scope, ARGV[2] key, ARGV[3] fingerprint (hex), ARGV[4] lease ms,
  ARGV[5] abandoned retention ms, ARGV[6] grace ms (how long the key outlives expires_at)
  Returns {1, token}                          acquired
          {1, token, {field, value, ...}}     acquired by a takeover: the record's step fields ('~' .. name)
          {2, lockedUntilMs}                  in progress (live lease, same fingerprint)
          {3, nowMs, {field, value, ...}}     replay: the whole completed/failed hash
          {4}                                 mismatch (live record, other fingerprint)
  Raises 'IDEMKEY_FOREIGN ...' when the key holds a hash idemkey did not write,
  and Redis raises WRONGTYPE when it holds another type. Time is the server's (TIME).
  Each redis.call adds about the work of a whole SET on the server (measured on Redis 7.0), so the
  common paths make as few as they can: a new key is TIME, HGETALL, HSET, PEXPIREAT; a replay is
  TIME, HGETALL. ]]
local rk = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function int(n) return string.format('%d', n) end
local lockedUntil = now + tonumber(ARGV[4])
local expiresAt = lockedUntil + tonumber(ARGV[5])
local grace = tonumber(ARGV[6])

-- One read tells an absent key (empty reply) from any hash, ours or not, without EXISTS.
local all = redis.call('HGETALL', rk)
if #all == 0 then
  redis.call('HSET', rk, 's', ARGV[1], 'k', ARGV[2], 'fp', ARGV[3], 'st', 'in_progress', 'tok', '1',
    'lu', int(lockedUntil), 'att', '1', 'ca', int(now), 'ua', int(now), 'ea', int(expiresAt))
  redis.call('PEXPIREAT', rk, int(expiresAt + grace))
  return {1, 1}
end

local f = {}
for i = 1, #all, 2 do f[all[i]] = all[i + 1] end
local st = f.st
local tok, lu, ea, att = tonumber(f.tok), tonumber(f.lu), tonumber(f.ea), tonumber(f.att)
local known = st == 'in_progress' or st == 'completed' or st == 'failed'
if f.s ~= ARGV[1] or f.k ~= ARGV[2] or not known or not tok or not ea or not att or (st == 'in_progress' and not lu) then
  return redis.error_reply('IDEMKEY_FOREIGN the key holds a hash that is not an idemkey record of this scope and key')
end

if ea <= now then
  -- Expired but not yet dropped by Redis: a new lifecycle. The token continues, so a zombie
  -- holder of the old one stays fenced out.
  local token = tok + 1
  redis.call('DEL', rk)
  redis.call('HSET', rk, 's', ARGV[1], 'k', ARGV[2], 'fp', ARGV[3], 'st', 'in_progress', 'tok', int(token),
    'lu', int(lockedUntil), 'att', '1', 'ca', int(now), 'ua', int(now), 'ea', int(expiresAt))
  redis.call('PEXPIREAT', rk, int(expiresAt + grace))
  return {1, token}
end

if st ~= 'in_progress' or lu > now then
  if f.fp ~= ARGV[3] then return {4} end
  if st == 'in_progress' then return {2, lu} end
  return {3, int(now), all}
end

-- Takeover: the holder's lease ended (it crashed, or released a transient failure).
redis.call('HSET', rk, 'fp', ARGV[3], 'tok', int(tok + 1), 'att', int(att + 1), 'lu', int(lockedUntil),
  'ua', int(now), 'ea', int(expiresAt))
redis.call('PEXPIREAT', rk, int(expiresAt + grace))
-- The steps the earlier attempts recorded (fields starting with '~'), read in the same step.
local steps = {}
for i = 1, #all, 2 do
  if string.byte(all[i], 1) == 126 then
    steps[#steps + 1] = all[i]
    steps[#steps + 1] = all[i + 1]
  end
end
if #steps == 0 then return {1, tok + 1} end
return {1, tok + 1, steps}
