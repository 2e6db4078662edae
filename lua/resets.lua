--[[ resets.lua: the count of resets the operator console made, which every tollgate instance
reads twice a second. When it changes, an instance forgets the refusals it remembers and the
holds it keeps, so a reset made through any instance holds on all of them.

KEYS[1]  the counter's key, <key_prefix>:console:resets
ARGV[1]  "bump" to count one more reset; empty to read

Returns the count. The key expires a day after the last reset, as every key of tollgate does;
the count then reads 0, which instances take as one more change.

Try it: redis-cli --eval lua/resets.lua tollgate:console:resets , bump
]]

if ARGV[1] == 'bump' then
  local n = redis.call('INCR', KEYS[1])
  redis.call('PEXPIRE', KEYS[1], 86400000)
  return n
end
return tonumber(redis.call('GET', KEYS[1]) or '0')
