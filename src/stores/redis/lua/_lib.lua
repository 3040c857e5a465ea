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
