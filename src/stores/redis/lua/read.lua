--[[ Read a record with the server's time, so the caller can tell live from expired.
  KEYS[1] record key
  Returns {nowMs, field, value, ...} (just {nowMs} when the key is absent) ]]
local all = redis.call('HGETALL', KEYS[1])
local t = redis.call('TIME')
table.insert(all, 1, string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)))
return all
