--[[ Delete a record (and its steps) if it has expired (expires_at <= now), by the server's clock.
  KEYS[1] record key, KEYS[2] its steps
  Returns 1 when deleted, 0 when live, absent, a watch marker or not an idemkey record ]]
local v = redis.pcall('GET', KEYS[1])
if type(v) ~= 'string' then return 0 end -- absent, or another type (WRONGTYPE): not ours to judge
local ea = tonumber(string.match(absolute(KEYS[1], v), '^ik1[01][01][pcf]|%d+|%d+|%d+|%d+|%d+|(%d+)|'))
if not ea then return 0 end
if ea > now_ms() then return 0 end
redis.call('DEL', KEYS[2])
return redis.call('DEL', KEYS[1])
