--[[ Helpers the scripts share: scripts/gen-lua.mjs puts in front of each script the ones it calls.
  Every value idemkey writes under a record key starts with 'ik1', the record-format tag (idemkey's
  packed record, format 1), then the flags w (1: someone waits) and s (1: steps recorded), then a state
  letter: p, c, f (in progress, completed, failed), n (fresh from the native acquire), C, F (completed
  by the native compare-and-set) or w (a watch marker). ]]
-- What watch.lua leaves under a key that holds no record yet: the tag, w set, s clear, state w. Every
-- other script counts it as absent; the record's acquire turns it into the record's w flag.
local WATCH_MARKER = 'ik110w'
local function int(n) return string.format('%d', n) end
-- The server's clock in epoch ms (one TIME call): leases and expiry never use the caller's.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
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
-- server's clock. A record completed by the native compare-and-set (SET ... IFEQ, Valkey 8.1+ and Redis
-- 8.4+) is `ik1 <w> <s> C|F | ttl | grace | age |` and the rest of a completed record: its expiry is the
-- key's minus grace, its completion that minus ttl, its creation that minus age (measured by the holder).
-- Returns the record as acquire.lua or complete.lua would have written it; any other value as it is.
local function absolute(rk, v)
  local w, s, st, a, b, c, rest = string.match(v, '^ik1([01])([01])([nCF])|(%d+)|(%d+)|(%d+)|()')
  if not w then return v end
  local et = redis.call('PEXPIRETIME', rk)
  if et < 0 then return 'ik1' .. w .. s .. 'n|damaged' end
  if st ~= 'n' then
    local ea = et - b
    local ua = ea - a
    return 'ik1' .. w .. s .. (st == 'C' and 'c' or 'f') .. '|1|' .. int(ua) .. '|1|' .. int(ua - c) .. '|' .. int(ua) .. '|' ..
      int(ea) .. '|' .. string.sub(v, rest)
  end
  local at = et - a - b - c
  return 'ik1' .. w .. s .. 'p|1|' .. int(at + a) .. '|1|' .. int(at) .. '|' .. int(at) .. '|' .. int(at + a + b) .. '|' ..
    string.sub(v, rest)
end
