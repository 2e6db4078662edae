--[[ pace_defer.lua: upstream back-pressure. Pushes a pacing schedule (the key that
leaky_bucket.lua keeps) so that no slot is handed out before `hold_ms` from now: used when an
upstream answers 429 or 503 with Retry-After, so that every tollgate instance holds off.

KEYS[1]  the schedule's key (the same key leaky_bucket.lua uses)
ARGV[1]  rate: requests per second of the schedule (> 0), as given to leaky_bucket.lua
ARGV[2]  hold_ms: no slot before now + hold_ms (>= 0)
ARGV[3]  now in milliseconds (optional, decimals allowed; absent or empty: the Redis server clock)

Returns the next free slot, in ms from now, as an integer rounded up. The schedule only moves
later, never earlier; the key expires once the schedule is idle again.

Try it: redis-cli --eval lua/pace_defer.lua tollgate:upstream:api:pace , 4 2000
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
local rate = num(ARGV[1])
local hold = num(ARGV[2])
local now, slack = now_ms(ARGV[3])
if key == nil or #ARGV > 3 or rate == nil or rate <= 0 or hold == nil or hold < 0 or now == nil then
  return redis.error_reply('usage: pace_defer.lua KEY , RATE>0 HOLD_MS>=0 [NOW_MS]')
end

-- A key of another type under this name means nothing here: the schedule starts afresh, as
-- in the memory store, instead of failing every call until the key expires.
local got = redis.pcall('GET', key)
if type(got) == 'table' and got.err then
  redis.call('DEL', key)
  got = nil
end
local slot = tonumber(got)
if slot == nil or slot < now + hold then
  slot = now + hold
  -- idle once the held slot and one interval after it have passed, as leaky_bucket.lua keeps it
  redis.call('SET', key, string.format('%.17g', slot), 'PX', math.max(1, math.ceil(hold + 1000 / rate)) + slack)
end
return math.ceil(slot - now)
