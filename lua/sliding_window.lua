--[[ sliding_window.lua: at most `limit` requests in any span of `window` (a log of admitted
requests in a sorted set).

KEYS[1]  the log's key, e.g. tollgate:<route>:<limit>:<client>
ARGV[1]  limit: requests per window (>= 1)
ARGV[2]  window_ms: the window's length in milliseconds (> 0)
ARGV[3]  now in milliseconds (optional, decimals allowed; absent or empty: the Redis server clock)

Returns {allowed 1|0, remaining, retry_after_ms, reset_ms}, all integers:
  remaining       requests left in the window after this one
  retry_after_ms  0 when allowed; else the time until enough old requests leave the window
  reset_ms        the time until the oldest logged request leaves the window (rounded up)

A request at time t counts while now < t + window. Stored: a sorted set, score = time of an
admitted request, member = that time plus a sequence number among requests of the same time, so
two requests in the same millisecond are two members. With the time alone as member
(`ZADD key now now`) they would be one, and the limit could be passed. Denied requests are not
logged. The set expires one window after its newest member.

Try it: redis-cli --eval lua/sliding_window.lua tollgate:demo:alice , 3 60000
Debug:  redis-cli --ldb --eval lua/sliding_window.lua tollgate:demo:alice , 3 60000
]]

-- A key's expiry runs on the server's clock from when the script runs. A caller's time (NOW_MS)
-- may lag that (read before the call waited, replayed, or advancing slower), so keys written on
-- it are kept SKEW_MS longer than that time needs: they must not vanish while the caller still
-- counts them (a stale key is harmless: every script checks what it reads against `now`).
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
local limit = num(ARGV[1])
local window = num(ARGV[2])
local now, slack = now_ms(ARGV[3])
if key == nil or #ARGV > 3 or limit == nil or limit < 1 or window == nil or window <= 0 or now == nil then
  return redis.error_reply('usage: sliding_window.lua KEY , LIMIT>=1 WINDOW_MS>0 [NOW_MS]')
end

-- A key of another type was left under this name by another algorithm (a reload changed the
-- limit's algorithm and kept its name): its state means nothing here, so it starts afresh, as
-- the memory store does, instead of failing every call until it expires.
local trimmed = redis.pcall('ZREMRANGEBYSCORE', key, '-inf', string.format('%.17g', now - window))
if type(trimmed) == 'table' and trimmed.err then
  redis.call('DEL', key)
end
local count = redis.call('ZCARD', key)
if count >= limit then
  -- the request is admitted once count - limit + 1 of the oldest entries have left
  local nth = redis.call('ZRANGE', key, count - limit, count - limit, 'WITHSCORES')
  local retry = math.max(1, math.ceil(tonumber(nth[2]) + window - now))
  return {0, 0, retry, retry}
end
local at = string.format('%.17g', now)
-- entries with one score are only ever removed together, so their count numbers them uniquely
local same = redis.call('ZCOUNT', key, at, at)
redis.call('ZADD', key, at, at .. ':' .. same)
redis.call('PEXPIRE', key, math.ceil(window) + slack)
local oldest = tonumber(redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2])
return {1, limit - count - 1, 0, math.max(1, math.ceil(oldest + window - now))}
