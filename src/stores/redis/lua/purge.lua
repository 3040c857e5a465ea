--[[ Delete a record if it has expired (expires_at <= now), by the server's clock.
  KEYS[1] record key
  Returns 1 when deleted, 0 when live, absent or not an idemkey record ]]
local raw = redis.pcall('HGET', KEYS[1], 'ea')
if type(raw) ~= 'string' then return 0 end -- absent, or another type (WRONGTYPE): not ours to judge
local ea = tonumber(raw)
if not ea then return 0 end
local t = redis.call('TIME')
if ea > tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) then return 0 end
return redis.call('DEL', KEYS[1])
