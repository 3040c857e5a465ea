--[[ Flag a record as waited on, so complete and release PUBLISH its changes (they skip PUBLISH when
  nobody waits). A watcher that comes before the record leaves a marker (WATCH_MARKER, _lib.lua, counted as
  absent by every other script) that the record's acquire turns into the flag.
  KEYS[1] record key
  ARGV[1] marker TTL ms
  Returns 1 ]]
local rk = KEYS[1]
local v = redis.pcall('GET', rk)
if type(v) == 'table' then return 1 end -- another type (WRONGTYPE): not ours to flag
if not v then
  redis.call('SET', rk, WATCH_MARKER, 'PX', ARGV[1])
elseif string.sub(v, 4, 4) == '0' and string.sub(v, 1, 3) == 'ik1' then
  redis.call('SETRANGE', rk, 3, '1')
end
return 1
