--[[ leaky_bucket.lua: pacing. Hands out send slots at most `rate` per second; the caller
sleeps the returned delay, then sends.

KEYS[1]  the schedule's key: tollgate:upstream:<upstream>:pace for an upstream's pacing,
         tollgate:<route>:<limit>:<client> for a leaky_bucket limit
ARGV[1]  rate: requests per second (> 0; decimals allowed)
ARGV[2]  max_delay_ms: the longest wait a caller accepts (optional; empty: no bound)
ARGV[3]  now in milliseconds (optional, decimals allowed; absent or empty: the Redis server clock)

Returns {admitted 1|0, delay_ms}:
  admitted  1: a slot is reserved delay_ms from now; 0: the wait would pass max_delay_ms and
            nothing was reserved (delay_ms then says how long the wait would have been)
  delay_ms  a decimal string with microsecond precision, e.g. "12.500"

The stored value is the next free slot (ms). Each admitted call takes slot = max(next, now) and
moves next to slot + 1000/rate, so admitted requests start at least 1/rate apart. One number per
key, written with %.17g so it reads back exactly; it expires once the schedule is idle.
The clock is the Redis server's, not the caller's. The wait is bounded. The state is one value,
not a sorted set that grows with every request.

Try it: redis-cli --eval lua/leaky_bucket.lua tollgate:upstream:api:pace , 4 1000
Debug:  redis-cli --ldb --eval lua/leaky_bucket.lua tollgate:upstream:api:pace , 4 1000
]]

-- Comparisons allow 1 microsecond: timestamps near 1.7e12 ms carry about 0.25 us of rounding.
local EPS = 0.001

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

-- Delays are reported to the nearest microsecond, as a decimal string: Redis would truncate a
-- returned Lua number to an integer.
local function delay_string(ms)
  return string.format('%.3f', math.floor(ms * 1000 + 0.5) / 1000)
end

local key = KEYS[1]
local rate = num(ARGV[1])
local max_delay, bad_max = nil, false
if ARGV[2] ~= nil and ARGV[2] ~= '' then
  max_delay = num(ARGV[2])
  bad_max = max_delay == nil
end
local now, slack = now_ms(ARGV[3])
if key == nil or #ARGV > 3 or rate == nil or rate <= 0 or now == nil or bad_max or (max_delay ~= nil and max_delay < 0) then
  return redis.error_reply('usage: leaky_bucket.lua KEY , RATE>0 [MAX_DELAY_MS] [NOW_MS]')
end

-- A key of another type was left under this name by another algorithm (a reload changed the
-- limit's algorithm and kept its name): its state means nothing here, so it starts afresh, as
-- the memory store does, instead of failing every call until it expires.
local got = redis.pcall('GET', key)
if type(got) == 'table' and got.err then
  redis.call('DEL', key)
  got = nil
end
local slot = tonumber(got)
if slot == nil or slot < now then
  slot = now
end
local delay = slot - now
if max_delay ~= nil and delay - max_delay > EPS then
  return {0, delay_string(delay)}
end
local ahead = delay + 1000 / rate
redis.call('SET', key, string.format('%.17g', now + ahead), 'PX', math.max(1, math.ceil(ahead)) + slack)
return {1, delay_string(delay)}
