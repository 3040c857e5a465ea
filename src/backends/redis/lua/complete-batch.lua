--[[ Completes several fresh records of the native acquire in one call (the store's group commit, one
  server only), each by compare-and-set, as `SET key <outcome> IFEQ <fresh record>` does on servers that
  have it: for each i, when KEYS[i] still holds exactly ARGV[3i-2] (the fresh record its holder wrote:
  token 1, in progress, nobody waiting, no steps, never renewed), it becomes ARGV[3i-1] with a TTL of
  ARGV[3i] ms. Returns one entry per key: 1 when written, 0 when the key holds anything else or nothing
  (the complete script then decides for that key, fenced by its token), or when its SET was refused
  (out of memory: the complete script meets the refusal itself and reports it to that caller alone). ]]
local out = {}
for i = 1, #KEYS do
  if redis.pcall('GET', KEYS[i]) == ARGV[3 * i - 2] and redis.pcall('SET', KEYS[i], ARGV[3 * i - 1], 'PX', ARGV[3 * i])['ok'] then
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
