--[[ Read a record with the server's time, so the caller can tell live from expired.
  KEYS[1] record key
  Returns {nowMs, record} (the packed record), or just {nowMs} when the key is absent or holds only a
  watch marker ]]
local rk = KEYS[1]
local now = int(now_ms())
local v = redis.pcall('GET', rk)
if type(v) == 'table' then return v end -- WRONGTYPE: the key holds another type
if not v or v == WATCH_MARKER then return {now} end
return {now, absolute(rk, v)}
