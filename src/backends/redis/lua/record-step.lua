--[[ Record one step of a record the caller still holds (docs/steps.md). Steps live in a hash beside
  the record (KEYS[2], same hash tag), as fields named '~' .. step name, expiring with the record; the
  record's steps flag tells the takeover's acquire to read them (a new key never touches that hash).
  KEYS[1] record key, KEYS[2] its steps
  ARGV[1] token, ARGV[2] step field ('~' .. name), ARGV[3] result (JSON text), or '' for a started
  marker (HSETNX: a marker never replaces a result; a result is never empty)
  Returns 1 when recorded, 0 when fenced out (another token, or no longer in progress) ]]
local rk = KEYS[1]
local v = redis.pcall('GET', rk)
if type(v) == 'table' then return v end -- WRONGTYPE: the key holds another type
if not v or v == WATCH_MARKER then return 0 end
v = absolute(rk, v)
local hasSteps, st, tok = string.match(v, '^ik1[01]([01])([pcf])|(%d+)|')
if not st then return unparsable(v) end
if tok ~= ARGV[1] or st ~= 'p' then return 0 end
if ARGV[3] == '' then redis.call('HSETNX', KEYS[2], ARGV[2], '') else redis.call('HSET', KEYS[2], ARGV[2], ARGV[3]) end
if hasSteps == '0' then
  redis.call('SETRANGE', rk, 4, '1')
  -- Renew, release and takeover keep the steps' TTL equal to the record's from now on.
  redis.call('PEXPIRE', KEYS[2], redis.call('PTTL', rk))
end
return 1
