--[[ sliding_window_counter.lua: about `limit` requests in any span of `window`, from two counters
(this aligned window and the previous one) instead of a log: constant memory per key.

KEYS[1]  the counters' key, e.g. tollgate:<route>:<limit>:<client>
ARGV[1]  limit: requests per window (>= 1)
ARGV[2]  window_ms: the window's length in milliseconds (> 0)
ARGV[3]  now in milliseconds (optional, decimals allowed; absent or empty: the Redis server clock)

Returns {allowed 1|0, remaining, retry_after_ms, reset_ms}, all integers:
  remaining       requests left after this one, by the weighted estimate
  retry_after_ms  0 when allowed; else the time until the estimate admits one more (rounded up)
  reset_ms        the time until the current aligned window ends, or until the estimate
                  admits a request again when that is later and none remains (a refusal, or
                  the last request admitted): a client told it is never back early

The estimate: the sliding window [now - window, now) covers the elapsed part of the current
aligned window and the last (window - elapsed) of the previous one. Assuming the previous
window's requests were spread evenly, (window - elapsed) / window of them are still inside, so
    estimate = prev * (window - elapsed) / window + curr
and a request is admitted while estimate + 1 <= limit. The product is taken before the division
so that whole-millisecond inputs give an exact estimate.
Stored: a hash {w = current window start (ms), c = its count, p = the previous window's count};
it expires when it can no longer serve as the previous window (two windows after w).

Try it: redis-cli --eval lua/sliding_window_counter.lua tollgate:demo:alice , 3 60000
Debug:  redis-cli --ldb --eval lua/sliding_window_counter.lua tollgate:demo:alice , 3 60000
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
  return redis.error_reply('usage: sliding_window_counter.lua KEY , LIMIT>=1 WINDOW_MS>0 [NOW_MS]')
end

local start = math.floor(now / window) * window
local window_end = start + window
-- A key of another type was left under this name by another algorithm (a reload changed the
-- limit's algorithm and kept its name): its state means nothing here, so it starts afresh, as
-- the memory store does, instead of failing every call until it expires.
local stored = redis.pcall('HMGET', key, 'w', 'c', 'p')
if stored.err then
  redis.call('DEL', key)
  stored = {}
end
local w = tonumber(stored[1])
local curr = tonumber(stored[2]) or 0
local prev = tonumber(stored[3]) or 0
if w ~= start then
  if w == start - window then
    prev = curr
  else
    prev = 0
  end
  curr = 0
end

-- The time from now until the estimate admits one more request, with these counts (when it does
-- not now).
local function wait_for_one(curr, prev)
  if curr + 1 <= limit then
    -- later in this window: prev * (window - e) / window + curr + 1 <= limit
    return window_end - (limit - 1 - curr) * window / prev - now
  end
  -- in the next window, where prev' = curr and curr' = 0: curr * (window - e) / window + 1 <= limit
  return window_end + window - (limit - 1) * window / curr - now
end

local estimate = prev * (window - now + start) / window + curr
if estimate + 1 > limit then
  local retry = math.max(1, math.ceil(wait_for_one(curr, prev)))
  return {0, 0, retry, math.max(retry, math.ceil(window_end - now))}
end
curr = curr + 1
redis.call('HSET', key, 'w', string.format('%.17g', start), 'c', curr, 'p', prev)
redis.call('PEXPIRE', key, math.max(1, math.ceil(window_end + window - now)) + slack)
local remaining = math.floor(limit - estimate - 1)
local reset = math.ceil(window_end - now)
if remaining <= 0 then
  -- none left: the quota is back no sooner than the next request is admitted
  reset = math.max(reset, math.ceil(wait_for_one(curr, prev)))
end
return {1, remaining, 0, math.max(1, reset)}
