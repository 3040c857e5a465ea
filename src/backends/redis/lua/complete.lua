--[[ Store the outcome of a record the caller still holds, and wake its waiters (if any).
  KEYS[1] record key, KEYS[2] its steps
  ARGV[1] token, ARGV[2] status ('c' completed | 'f' failed), ARGV[3] the response's head
  ('<status>|<resource id bytes, or -1>|<headers bytes>|' .. resource id .. headers JSON), ARGV[4] body
  (bytes), ARGV[5] ttl ms, ARGV[6] the key's TTL ms (ttl + grace), ARGV[7] notification channel
  Returns 1 when stored, 0 when fenced out (another token, or no longer in progress)
  The common path is GET, TIME, SET (GET, PEXPIRETIME, PTTL, SET for a fresh record of the native
  acquire): PUBLISH only when an in_progress answer or a watch flagged waiters, DEL of the steps only
  when steps were recorded. ]]
local rk = KEYS[1]
local v = redis.pcall('GET', rk)
if type(v) == 'table' then return v end -- WRONGTYPE: the key holds another type
if not v or v == WATCH_MARKER then return 0 end
-- The completed record's head, from fields read straight from the value: this script runs once per
-- request, and every string it builds, match it captures and helper it calls costs Redis CPU (so no
-- absolute() rewrite of a fresh record first, and one string.format for the head's numbers). lu stays
-- (readers ignore it once completed); the steps flag drops (the steps go). Byte 6 is the status.
local head, p
local st = string.byte(v, 6)
if st == 110 then
  -- A fresh record of the native acquire (token 1, attempt 1): its creation time is the key's expiry
  -- minus the durations it holds (see absolute() in _lib.lua).
  local l, r, g, q = string.match(v, '^ik1[01][01]n|(%d+)|(%d+)|(%d+)|()')
  if not l then return unparsable(v) end
  if ARGV[1] ~= '1' then return 0 end
  local et = redis.call('PEXPIRETIME', rk)
  if et < 0 then return 0 end
  local at = et - l - r - g
  -- The server's time from the same expiry: PTTL answers one integer, TIME two strings to convert.
  local now = et - redis.call('PTTL', rk)
  head, p = string.format('%s0%s|1|%d|1|%d|%d|%d|', string.sub(v, 1, 4), ARGV[2], at + l, at, now, now + ARGV[5]), q
elseif st == 112 then
  local tok, lu, att, ca, q = string.match(v, '^ik1[01][01]p|(%d+)|(%d+)|(%d+)|(%d+)|%d+|%d+|()')
  if not tok then return unparsable(v) end
  if tok ~= ARGV[1] then return 0 end
  local now = now_ms()
  head, p = string.format('%s0%s|%s|%s|%s|%s|%d|%d|', string.sub(v, 1, 4), ARGV[2], tok, lu, att, ca, now, now + ARGV[5]), q
elseif string.match(v, '^ik1[01][01][cfCF]|') then
  return 0 -- completed or failed (C, F: by the native compare-and-set): no longer in progress
else
  return unparsable(v)
end
-- Identity and fingerprint are copied as they are.
redis.call('SET', rk, head .. string.sub(v, p) .. ARGV[3] .. ARGV[4], 'PX', ARGV[6])
-- A completed record is never taken over: its steps are no longer needed.
if string.byte(v, 5) == 49 then redis.call('DEL', KEYS[2]) end
if string.byte(v, 4) == 49 then redis.call('PUBLISH', ARGV[7], '1') end
return 1
