--[[ Acquire a record: take it when no live record holds it, else say why not. One atomic step.
  KEYS[1] record key (a string: the packed record, docs/redis.md), KEYS[2] its steps (a hash)
  ARGV[1] fingerprint (64 hex), ARGV[2] identity ('<scope bytes>|<key bytes>|' .. scope .. key),
  ARGV[3] lease ms, ARGV[4] abandoned retention ms, ARGV[5] grace ms (how long the key outlives expires_at)
  Returns {1, token}                          acquired
          {1, token, {field, value, ...}}     acquired by a takeover: the steps ('~' .. name, result)
          {2, lockedUntilMs}                  in progress (live lease, same fingerprint)
          {3, nowMs, record}                  replay: the packed record
          {4}                                 mismatch (live record, or an ended attempt with steps, other fingerprint)
  Raises 'IDEMKEY_FOREIGN ...' when the key holds a value idemkey did not write, and Redis raises
  WRONGTYPE when it holds another type. Time is the server's (TIME).
  Each redis.call costs about a whole SET on the server, so a new key (by far the most common
  acquire) is TIME and one SET NX with its TTL; a replay is TIME and the same SET NX, whose GET
  option (Redis 7.0+) returns the record it did not replace. ]]
local rk = KEYS[1]
local now = now_ms()
local lockedUntil = now + tonumber(ARGV[3])
local expiresAt = lockedUntil + tonumber(ARGV[4])
local px = int(expiresAt + tonumber(ARGV[5]) - now)
local function fresh(w, token)
  return 'ik1' .. w .. '0p|' .. int(token) .. '|' .. int(lockedUntil) .. '|1|' .. int(now) .. '|' .. int(now) .. '|' ..
    int(expiresAt) .. '|' .. ARGV[1] .. ARGV[2]
end

local v = redis.pcall('SET', rk, fresh('0', 1), 'NX', 'GET', 'PX', px)
if not v then return {1, 1} end
if type(v) == 'table' then
  -- An error: the key holds another type, or the server predates SET NX GET (Redis 6.2).
  local kind = redis.call('TYPE', rk)['ok']
  if kind == 'none' then
    redis.call('SET', rk, fresh('0', 1), 'PX', px)
    return {1, 1}
  end
  if kind ~= 'string' then return v end -- WRONGTYPE
  v = redis.call('GET', rk)
end

local foreign = 'IDEMKEY_FOREIGN the key holds a value that is not an idemkey record of this scope and key'
-- A watch marker (a watcher came before the record): the key counts as absent; waiters are flagged.
if v == WATCH_MARKER then
  redis.call('SET', rk, fresh('1', 1), 'PX', px)
  return {1, 1}
end
local stored = v
v = absolute(rk, v)
local st, tok, lu, att, ca, ea, p = string.match(v, '^ik1[01][01]([pcf])|(%d+)|(%d+)|(%d+)|(%d+)|%d+|(%d+)|()')
if not st or string.sub(v, p + 64, p + 63 + #ARGV[2]) ~= ARGV[2] then return redis.error_reply(foreign) end
local w, hasSteps = string.sub(v, 4, 4), string.sub(v, 5, 5)
tok, lu, ea = tonumber(tok), tonumber(lu), tonumber(ea)

if ea <= now then
  -- Expired but not yet dropped by Redis: a new lifecycle. The token continues, so a zombie
  -- holder of the old one stays fenced out; the old lifecycle's steps go.
  if hasSteps == '1' then redis.call('DEL', KEYS[2]) end
  redis.call('SET', rk, fresh(w, tok + 1), 'PX', px)
  return {1, tok + 1}
end

if st ~= 'p' or lu > now then
  if string.sub(v, p, p + 63) ~= ARGV[1] then return {4} end
  if st == 'p' then
    -- Someone waits from now on: complete and release publish only when this flag is set.
    if w == '0' then redis.call('SETRANGE', rk, 3, '1') end
    return {2, lu}
  end
  -- A record completed by compare-and-set (C, F: durations) is kept from now on in the absolute form it
  -- was just read as (c, f), its TTL unchanged: its later replays are then answered by the native
  -- acquire's SET NX GET alone, without this script.
  if v ~= stored then redis.call('SET', rk, v, 'KEEPTTL') end
  return {3, int(now), v}
end

-- Takeover: the holder's lease ended (it crashed, or released a transient failure). Another request
-- (another fingerprint) takes it only if the ended attempt left no steps: they are its own request's
-- partial effects, never to be handed to a different one.
if hasSteps == '1' and string.sub(v, p, p + 63) ~= ARGV[1] and redis.call('EXISTS', KEYS[2]) == 1 then return {4} end
redis.call('SET', rk, 'ik1' .. w .. hasSteps .. 'p|' .. int(tok + 1) .. '|' .. int(lockedUntil) .. '|' .. int(tonumber(att) + 1) ..
  '|' .. ca .. '|' .. int(now) .. '|' .. int(expiresAt) .. '|' .. ARGV[1] .. ARGV[2], 'PX', px)
if hasSteps == '0' then return {1, tok + 1} end
-- The steps the earlier attempts recorded, read in the same step; they live as long as the record.
local steps = redis.call('HGETALL', KEYS[2])
redis.call('PEXPIRE', KEYS[2], px)
if #steps == 0 then return {1, tok + 1} end
return {1, tok + 1, steps}
