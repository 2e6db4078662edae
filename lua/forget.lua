--[[ forget.lua: forgets a limit's key, so the client's next request is decided as a new
client's. The operator console's reset, and the lift of an upstream's hold (its schedule's key).

KEYS[1]  the key, e.g. tollgate:<route>:<limit>:<client>

Returns 1 when the key held something, 0 when it did not.

Try it: redis-cli --eval lua/forget.lua tollgate:demo:alice
]]

return redis.call('DEL', KEYS[1])
