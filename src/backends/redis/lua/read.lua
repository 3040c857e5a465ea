--[[ Read a record with the server's time, so the caller can tell live from expired.
  KEYS[1] record key
  Returns {nowMs, record} (the packed record), {nowMs, field, value, ...} (a round-1 hash), or just
  {nowMs} when the key is absent or holds only a watch marker ]]
local rk = KEYS[1]
local now = int(now_ms())
local v = redis.pcall('GET', rk)
if type(v) == 'table' then
  if redis.call('TYPE', rk)['ok'] ~= 'hash' then return v end
  local all = redis.call('HGETALL', rk)
  table.insert(all, 1, now)
  return all
end
if not v or v == 'ik110w' then return {now} end
return {now, absolute(rk, v)}
