--[[ Record one step of a record the caller still holds (docs/steps.md). Steps live in the record's
  own hash, as fields named '~' .. step name, so they expire and are deleted with the record, and a
  takeover's acquire reads them with the record.
  KEYS[1] record key
  ARGV[1] token, ARGV[2] step field ('~' .. name), ARGV[3] result (JSON text), or '' for a started
  marker (HSETNX: a marker never replaces a result; a result is never empty)
  Returns 1 when recorded, 0 when fenced out (another token, or no longer in progress) ]]
local rk = KEYS[1]
local f = redis.call('HMGET', rk, 'tok', 'st')
if f[1] ~= ARGV[1] or f[2] ~= 'in_progress' then return 0 end
if ARGV[3] == '' then
  redis.call('HSETNX', rk, ARGV[2], '')
else
  redis.call('HSET', rk, ARGV[2], ARGV[3])
end
return 1
