--[[ concurrency.lua: at most `limit` requests in flight per key, across every instance. A
request takes a slot when it starts and gives it back when its response ends. Each slot is a
lease: its holder renews it while the request runs, so the slots of an instance that dies free
themselves when their leases end.

KEYS[1]  the key, e.g. tollgate:<route>:<limit>:<client>, or tollgate:upstream:<name>:inflight
ARGV[1]  op: acquire | renew | release | look
ARGV[2]  limit: slots held at once (>= 1)
ARGV[3]  lease_ms: how long a slot lasts unless renewed (> 0)
ARGV[4]  holders: acquire, one holder id; renew and release, one or more, separated by spaces;
         look, empty
ARGV[5]  now in milliseconds (optional, decimals allowed; absent or empty: the Redis server clock)

Returns, for acquire and look, {admitted 1|0, free, wait_ms, held}, all integers:
  admitted  1: the holder has a slot (look: a new holder would get one; nothing is taken)
  free      slots free after this call
  wait_ms   0 when admitted; else the time until the earliest lease ends (rounded up)
  held      slots held after this call
for renew and release, the number of the holders that held a slot.

Stored: a sorted set, member = holder id, score = the end of its lease (ms). Every call first
drops the leases that ended (score <= now). acquire admits while fewer than `limit` are held; a
holder that holds a slot already keeps it, renewed. renew pushes the lease of each holder still
present to now + lease_ms; release removes them. acquire and renew set the key's expiry to the
lease, so an idle key vanishes. A refusal takes nothing.

Try it: redis-cli --eval lua/concurrency.lua tollgate:demo:alice , acquire 2 10000 i1:1
        redis-cli --eval lua/concurrency.lua tollgate:demo:alice , renew 2 10000 "i1:1 i1:2"
        redis-cli --eval lua/concurrency.lua tollgate:demo:alice , release 2 10000 i1:1
Debug:  redis-cli --ldb --eval lua/concurrency.lua tollgate:demo:alice , acquire 2 10000 i1:1
]]

-- A key's expiry runs on the server's clock from when the script runs. A caller's time (NOW_MS)
-- may lag that (read before the call waited, replayed, or advancing slower), so keys written on
-- it are kept SKEW_MS longer than that time needs: they must not vanish while the caller still
-- counts them (a stale key is harmless: every call drops the leases that ended before `now`).
local SKEW_MS = 10000

-- An argument as a finite number, or nil: tonumber also reads "nan", "inf" and "1e400".
local function num(s)
  local n = tonumber(s)
  if n ~= nil and n == n and n ~= math.huge and n ~= -math.huge then
    return n
  end
  return nil
end

local function now_ms(arg)
  if arg ~= nil and arg ~= '' then
    return num(arg), SKEW_MS
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000, 0
end

local key = KEYS[1]
local op = ARGV[1]
local limit = num(ARGV[2])
local lease = num(ARGV[3])
local holders = ARGV[4] or ''
local now, slack = now_ms(ARGV[5])
local ops = {acquire = true, renew = true, release = true, look = true}
local one = string.match(holders, '^%S+$')
if key == nil or #ARGV > 5 or not ops[op] or limit == nil or limit < 1 or limit ~= math.floor(limit)
    or lease == nil or lease <= 0 or now == nil or (op == 'acquire' and one == nil) then
  return redis.error_reply('usage: concurrency.lua KEY , acquire|renew|release|look LIMIT>=1 LEASE_MS>0 HOLDERS [NOW_MS]')
end

-- A key of another type was left under this name by another algorithm (a reload changed the
-- limit's algorithm and kept its name): it holds no slot. acquire starts afresh; renew and
-- release, sent for requests from before the reload, leave the new limit's state alone, and
-- look takes nothing.
local kind = redis.call('TYPE', key).ok
if kind ~= 'zset' and kind ~= 'none' then
  if op == 'renew' or op == 'release' then
    return 0
  elseif op == 'look' then
    return {1, limit - 1, 0, 0}
  end
  redis.call('DEL', key)
end
-- Scores are written with %.17g so they read back as the exact double that was summed.
redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.17g', now))
local held = redis.call('ZCARD', key)
local ends = string.format('%.17g', now + lease)
local ttl = math.ceil(lease) + slack

if op == 'renew' then
  local renewed = 0
  for holder in string.gmatch(holders, '%S+') do
    if redis.call('ZSCORE', key, holder) then
      redis.call('ZADD', key, ends, holder)
      renewed = renewed + 1
    end
  end
  if renewed > 0 then
    redis.call('PEXPIRE', key, ttl)
  end
  return renewed
elseif op == 'release' then
  local released = 0
  for holder in string.gmatch(holders, '%S+') do
    released = released + redis.call('ZREM', key, holder)
  end
  return released
end

if op == 'acquire' and redis.call('ZSCORE', key, one) then
  redis.call('ZADD', key, ends, one)
  redis.call('PEXPIRE', key, ttl)
  return {1, math.max(0, limit - held), 0, held}
end
if held >= limit then
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  return {0, 0, math.max(1, math.ceil(tonumber(first[2]) - now)), held}
end
if op == 'look' then
  return {1, limit - held - 1, 0, held}
end
redis.call('ZADD', key, ends, one)
redis.call('PEXPIRE', key, ttl)
return {1, limit - held - 1, 0, held + 1}
