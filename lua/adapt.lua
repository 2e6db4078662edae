--[[ adapt.lua: adaptive pacing. Keeps one upstream's current rate, shared by every tollgate
instance, and moves it as AIMD does: down by a factor on trouble, up by a step when healthy.

KEYS[1]  the rate's key: tollgate:upstream:<upstream>:rate
ARGV[1]  start: the rate when the key holds none, requests per second (> 0; decimals allowed):
         the configured rate, or the rate the caller last knew, so that a rate lost with an
         emptied Redis resumes from where the fleet was
ARGV[2]  min: the rate never falls below this (> 0, <= start)
ARGV[3]  max: the rate never rises above this (>= start)
ARGV[4]  increase: requests per second added after a healthy period (> 0)
ARGV[5]  decrease: the factor applied after a period of trouble (0 < decrease < 1)
ARGV[6]  report: trouble | healthy | quiet (what the caller saw in its last period)
ARGV[7]  period_ms: at most one increase per this many ms, one decrease per twice as many (> 0)
ARGV[8]  now in milliseconds (optional, decimals allowed; absent or empty: the Redis server clock)

Returns the current rate, requests per second, as a decimal string written with %.17g (it
reads back exactly): Redis would truncate a returned Lua number to an integer.

The key is a hash: rate, changed (ms of the last change), fell (ms of the last decrease).
Every instance reports the same episode of trouble, so trouble lowers the rate only when the
last decrease is two periods old, and health raises it only when the last change is a period
old: N instances do not multiply the rate down N times. A quiet report reads and writes nothing.
The key expires an hour after the last report that was not quiet; the rate then starts again.

Try it: redis-cli --eval lua/adapt.lua tollgate:upstream:api:rate , 100 1 200 1 0.7 trouble 500
]]

-- Comparisons allow 1 microsecond: timestamps near 1.7e12 ms carry about 0.25 us of rounding.
local EPS = 0.001

-- Periods between two decreases (`FALL_PERIODS` in Rust): the answers of the period right after
-- a fall still show the load from before it (requests queued at the old spacing, an upstream
-- that counts its load over a second), and must not cut the rate again.
local FALL_PERIODS = 2

-- How long an idle rate is kept (the memory store's `KEEP_MS`).
local KEEP_MS = 3600000

-- A key's expiry runs on the server's clock from when the script runs. A caller's time (NOW_MS)
-- may lag that, so keys written on it are kept SKEW_MS longer (a stale key is harmless).
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
local start, min, max = num(ARGV[1]), num(ARGV[2]), num(ARGV[3])
local increase, decrease = num(ARGV[4]), num(ARGV[5])
local report, period = ARGV[6], num(ARGV[7])
local now, slack = now_ms(ARGV[8])
if key == nil or #ARGV > 8 or start == nil or min == nil or max == nil or min <= 0
    or start < min or start > max or increase == nil or increase <= 0 or decrease == nil
    or decrease <= 0 or decrease >= 1 or period == nil or period <= 0 or now == nil
    or (report ~= 'trouble' and report ~= 'healthy' and report ~= 'quiet') then
  return redis.error_reply('usage: adapt.lua KEY , START MIN MAX INCREASE 0<DECREASE<1 '
    .. 'trouble|healthy|quiet PERIOD_MS [NOW_MS]')
end

-- A key of another type under this name means nothing here: the rate starts afresh, as in the
-- memory store, instead of failing every call until the key expires.
local got = redis.pcall('HMGET', key, 'rate', 'changed', 'fell')
if got.err then
  redis.call('DEL', key)
  got = {}
end
local fall_gap = FALL_PERIODS * period
local rate, changed, fell = tonumber(got[1]), tonumber(got[2]), tonumber(got[3])
if rate == nil or changed == nil or fell == nil then
  -- a new rate may change at once: its last changes lie far enough back
  rate, changed, fell = start, now - fall_gap, now - fall_gap
end
-- (a reload may have moved min or max past the stored rate)
if rate < min then
  rate = min
end
if rate > max then
  rate = max
end

if report == 'quiet' then
  return string.format('%.17g', rate)
end
if report == 'trouble' and now - fell >= fall_gap - EPS then
  rate = rate * decrease
  if rate < min then
    rate = min
  end
  fell = now
  changed = now
elseif report == 'healthy' and now - changed >= period - EPS then
  rate = rate + increase
  if rate > max then
    rate = max
  end
  changed = now
end
redis.call('HSET', key, 'rate', string.format('%.17g', rate),
  'changed', string.format('%.17g', changed), 'fell', string.format('%.17g', fell))
redis.call('PEXPIRE', key, KEEP_MS + slack)
return string.format('%.17g', rate)
