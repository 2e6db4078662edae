--[[ peek.lua: reads what a limit's key holds, and changes nothing. The operator console asks it
what a client's next request would get: tollgate runs the limit's algorithm on the state read
here, as the scripts would, and keeps the answer to itself.

KEYS[1]  the key, e.g. tollgate:<route>:<limit>:<client>

Returns {now_ms, kind, ...}, now_ms the Redis server's clock in ms as text, and kind the type
of the key with what it holds:
  none                        the key does not exist: a new client
  string, value               token_bucket's theoretical arrival time, leaky_bucket's next slot
  hash, w, c, p               fixed_window's window start and count (p empty);
                              sliding_window_counter's window start, count and previous count
  zset, t1, t2, ...           sliding_window's entry times, oldest first

Try it: redis-cli --eval lua/token_bucket.lua tollgate:demo:alice , 10 20
        redis-cli --eval lua/peek.lua tollgate:demo:alice
]]

local time = redis.call('TIME')
local now = string.format('%.3f', tonumber(time[1]) * 1000 + tonumber(time[2]) / 1000)
local key = KEYS[1]
local kind = redis.call('TYPE', key).ok
if kind == 'string' then
  return {now, kind, redis.call('GET', key)}
elseif kind == 'hash' then
  local stored = redis.call('HMGET', key, 'w', 'c', 'p')
  return {now, kind, stored[1] or '', stored[2] or '', stored[3] or ''}
elseif kind == 'zset' then
  local reply = {now, kind}
  local entries = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
  for i = 2, #entries, 2 do
    reply[#reply + 1] = entries[i]
  end
  return reply
end
return {now, 'none'}
