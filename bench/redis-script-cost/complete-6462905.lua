--[[ Shared by every script: scripts/gen-lua.mjs puts this file in front of each one. ]]
local function int(n) return string.format('%d', n) end
-- The server's clock in epoch ms (one TIME call): leases and expiry never use the caller's.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- Whether `token` still holds a record of the round-1 layout (a hash) in progress.
local function legacy_held(rk, token)
  local f = redis.call('HMGET', rk, 'tok', 'st')
  return f[1] == token and f[2] == 'in_progress'
end
-- The answer to a packed record that does not parse: an idemkey record with a damaged field is held by
-- no token (fenced out; acquire reports it as foreign); anything else is not ours.
local function unparsable(v)
  if string.sub(v, 1, 3) == 'ik1' then return 0 end
  return redis.error_reply('IDEMKEY_FOREIGN the key holds a value that is not an idemkey record')
end
-- Gives the packed record v, which `token` must hold in progress, a new lease end: lockedUntil, updatedAt
-- (now) and expiresAt, the key's TTL (expiresAt + grace) and, when it has steps, theirs. Returns 1, or 0 when
-- the token does not hold it (fenced out), or the answer to a value that does not parse. Renew and release.
local function relock(rk, stepsKey, v, token, now, lockedUntil, expiresAt, grace)
  local head, st, tok, att, ca, p = string.match(v, '^(ik1[01][01])([pcf])|(%d+)|%d+|(%d+)|(%d+)|%d+|%d+|()')
  if not st then return unparsable(v) end
  if tok ~= token or st ~= 'p' then return 0 end
  local px = int(expiresAt + grace - now)
  redis.call('SET', rk, head .. 'p|' .. tok .. '|' .. int(lockedUntil) .. '|' .. att .. '|' .. ca .. '|' .. int(now) .. '|' ..
    int(expiresAt) .. '|' .. string.sub(v, p), 'PX', px)
  if string.sub(head, 5, 5) == '1' then redis.call('PEXPIRE', stepsKey, px) end
  return 1
end
-- A record written by the native acquire (a plain SET NX, no script: the common new key) holds its lease
-- as durations, `ik1 <w> <s> n | lease | retention | grace |` and the rest of a fresh record: its
-- times follow from the key's expiry, which that SET set to its own time plus their sum, on the
-- server's clock. Returns the record as acquire.lua would have written it (token 1, attempt 1);
-- any other value as it is.
local function absolute(rk, v)
  local w, s, l, r, g, rest = string.match(v, '^ik1([01])([01])n|(%d+)|(%d+)|(%d+)|()')
  if not w then return v end
  l, r, g = tonumber(l), tonumber(r), tonumber(g)
  local et = redis.call('PEXPIRETIME', rk)
  if et < 0 then return 'ik1' .. w .. s .. 'n|damaged' end
  local at = et - l - r - g
  return 'ik1' .. w .. s .. 'p|1|' .. int(at + l) .. '|1|' .. int(at) .. '|' .. int(at) .. '|' .. int(at + l + r) .. '|' ..
    string.sub(v, rest)
end
--[[ Store the outcome of a record the caller still holds, and wake its waiters (if any).
  KEYS[1] record key, KEYS[2] its steps
  ARGV[1] token, ARGV[2] status ('c' completed | 'f' failed), ARGV[3] the response's head
  ('<status>|<resource id bytes, or -1>|<headers bytes>|' .. resource id .. headers JSON), ARGV[4] body
  (bytes), ARGV[5] ttl ms, ARGV[6] grace ms, ARGV[7] notification channel
  Returns 1 when stored, 0 when fenced out (another token, or no longer in progress)
  The common path is GET, TIME, SET: PUBLISH only when an in_progress answer or a watch flagged
  waiters, DEL of the steps only when steps were recorded. ]]
local rk = KEYS[1]
local v = redis.pcall('GET', rk)
if type(v) == 'table' then
  if redis.call('TYPE', rk)['ok'] ~= 'hash' then return v end
  -- A record of the round-1 layout (a hash), completed as round 1 did.
  if not legacy_held(rk, ARGV[1]) then return 0 end
  local now = now_ms()
  local expiresAt = now + tonumber(ARGV[5])
  local status, ridLen, headLen, q = string.match(ARGV[3], '^(%d+)|(-?%d+)|(%d+)|()')
  ridLen, headLen = tonumber(ridLen), tonumber(headLen)
  local rid = ridLen >= 0 and string.sub(ARGV[3], q, q + ridLen - 1) or nil
  local headers = string.sub(ARGV[3], q + math.max(ridLen, 0))
  redis.call('HSET', rk, 'st', ARGV[2] == 'c' and 'completed' or 'failed', 'rs', status, 'rh', headers, 'rb', ARGV[4],
    'ua', string.format('%d', now), 'ea', string.format('%d', expiresAt))
  if rid then redis.call('HSET', rk, 'rid', rid) end
  redis.call('PEXPIREAT', rk, string.format('%d', expiresAt + tonumber(ARGV[6])))
  redis.call('PUBLISH', ARGV[7], '1')
  return 1
end
if not v or v == 'ik110w' then return 0 end
v = absolute(rk, v)
local w, hasSteps, st, tok, lu, att, ca, p = string.match(v, '^ik1([01])([01])([pcf])|(%d+)|(%d+)|(%d+)|(%d+)|%d+|%d+|()')
if not st then return unparsable(v) end
if tok ~= ARGV[1] or st ~= 'p' then return 0 end
local now = now_ms()
local ttl = tonumber(ARGV[5])
-- lu stays (readers ignore it once completed); identity and fingerprint are copied as they are.
redis.call('SET', rk, 'ik1' .. w .. '0' .. ARGV[2] .. '|' .. tok .. '|' .. lu .. '|' .. att .. '|' .. ca .. '|' ..
  string.format('%d', now) .. '|' .. string.format('%d', now + ttl) .. '|' .. string.sub(v, p) .. ARGV[3] .. ARGV[4],
  'PX', string.format('%d', ttl + tonumber(ARGV[6])))
-- A completed record is never taken over: its steps are no longer needed.
if hasSteps == '1' then redis.call('DEL', KEYS[2]) end
if w == '1' then redis.call('PUBLISH', ARGV[7], '1') end
return 1
