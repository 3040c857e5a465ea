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
