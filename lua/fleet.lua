--[[ fleet.lua: the fleet's figures for the operator console. Every tollgate instance publishes
its figures here once a second; the console's fleet view (/api/stats?scope=fleet) reads them.

KEYS[1]  the figures, a hash of instance id to blob:             {<key_prefix>:fleet}
KEYS[2]  when each instance was last seen, a sorted set of id to
         the server's clock in ms:                                {<key_prefix>:fleet}:seen
         (both keys share one hash tag, so one call works on a Redis Cluster)
ARGV[1]  publish or read
ARGV[2]  STALE_MS: an instance not seen for this long is dropped, and both keys expire after it
ARGV[3]  MAX_BYTES: the largest blob taken                 (publish only)
ARGV[4]  MAX_INSTANCES: the most instances kept            (publish only)
ARGV[5]  the instance's id                                 (publish only)
ARGV[6]  its blob, any bytes                               (publish only)

Both drop the instances not seen for STALE_MS first.
publish: keeps the blob and the server's time under the id, and sets both keys to expire after
  STALE_MS. Returns how many instances are kept, or 0 when the id is new and MAX_INSTANCES are
  kept already (nothing is written then). A blob over MAX_BYTES is an error.
read: returns {now_ms, id, seen_ms, blob, id, seen_ms, blob, ...}, the longest unseen first.

Try it: redis-cli --eval lua/fleet.lua '{tollgate:fleet}' '{tollgate:fleet}:seen' , publish 5000 65536 1000 a '{"rps":1}'
        redis-cli --eval lua/fleet.lua '{tollgate:fleet}' '{tollgate:fleet}:seen' , read 5000
]]

local blobs, seen = KEYS[1], KEYS[2]
local op, stale = ARGV[1], tonumber(ARGV[2])
local max_bytes, max_n, id, blob = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5], ARGV[6]
local publish = op == 'publish' and max_bytes and max_n and max_n >= 1 and id and id ~= '' and blob
if #KEYS ~= 2 or not stale or stale <= 0 or not (publish or op == 'read') then
  return redis.error_reply('usage: fleet.lua FLEET SEEN , publish STALE_MS>0 MAX_BYTES MAX_INSTANCES>=1 ID BLOB | read STALE_MS>0')
end
if publish and #blob > max_bytes then
  return redis.error_reply('fleet.lua: a blob of ' .. #blob .. ' bytes is over the bound of ' .. ARGV[3])
end

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local gone = redis.call('ZRANGEBYSCORE', seen, '-inf', string.format('(%.0f', now - stale))
for i = 1, #gone do
  redis.call('ZREM', seen, gone[i])
  redis.call('HDEL', blobs, gone[i])
end

if op == 'read' then
  local reply = {string.format('%.0f', now)}
  local ids = redis.call('ZRANGE', seen, 0, -1, 'WITHSCORES')
  for i = 1, #ids, 2 do
    local kept = redis.call('HGET', blobs, ids[i])
    if kept then
      reply[#reply + 1] = ids[i]
      reply[#reply + 1] = ids[i + 1]
      reply[#reply + 1] = kept
    end
  end
  return reply
end

if not redis.call('ZSCORE', seen, id) and redis.call('ZCARD', seen) >= max_n then
  return 0
end
redis.call('HSET', blobs, id, blob)
redis.call('ZADD', seen, now, id)
redis.call('PEXPIRE', blobs, stale)
redis.call('PEXPIRE', seen, stale)
return redis.call('ZCARD', seen)
