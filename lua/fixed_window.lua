--[[ fixed_window.lua: at most `limit` requests per window; windows are aligned to multiples of
`window` on the clock (a 1-minute window runs from :00 to :00), so a busy client is reset at the
end of every window.

KEYS[1]  the counter's key, e.g. tollgate:<route>:<limit>:<client>
ARGV[1]  limit: requests per window (>= 1)
ARGV[2]  window_ms: the window's length in milliseconds (> 0)
ARGV[3]  now in milliseconds (optional, decimals allowed; absent or empty: the Redis server clock)

Returns {allowed 1|0, remaining, retry_after_ms, reset_ms}, all integers:
  remaining       requests left in this window after this one
  retry_after_ms  0 when allowed; else the time until the window ends (rounded up)
  reset_ms        the time until the window ends (rounded up)

Stored: a hash {w = window start (ms), c = count}; it expires when its window ends. A request
does not push the expiry forward: that would keep a busy client locked out for ever. The answer
is an integer, not a Lua boolean, because Redis turns a Lua false into nil.

Try it: redis-cli --eval lua/fixed_window.lua tollgate:demo:alice , 3 60000
Debug:  redis-cli --ldb --eval lua/fixed_window.lua tollgate:demo:alice , 3 60000
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
  return redis.error_reply('usage: fixed_window.lua KEY , LIMIT>=1 WINDOW_MS>0 [NOW_MS]')
end

local start = math.floor(now / window) * window
local reset = math.max(1, math.ceil(start + window - now))
-- A key of another type was left under this name by another algorithm (a reload changed the
-- limit's algorithm and kept its name): its state means nothing here, so it starts afresh, as
-- the memory store does, instead of failing every call until it expires.
local stored = redis.pcall('HMGET', key, 'w', 'c')
if stored.err then
  redis.call('DEL', key)
  stored = {}
end
local count = 0
if tonumber(stored[1]) == start then
  count = tonumber(stored[2]) or 0
end
if count >= limit then
  return {0, 0, reset, reset}
end
count = count + 1
redis.call('HSET', key, 'w', string.format('%.17g', start), 'c', count)
redis.call('PEXPIRE', key, reset + slack)
return {1, limit - count, 0, reset}
