--[[ charge.lua: charges a limit what the upstream reported after the response. The request was
admitted for its cost; the response said it used `reported`; this script charges the difference,
`amount = reported - cost`. A positive amount may take the key below empty (debt), a negative one
gives back, never past a full quota.

KEYS[1]  the limit's key, the one its check ran on
ARGV[1]  the algorithm: token_bucket | fixed_window | sliding_window_counter
ARGV[2]  token_bucket: rate (tokens per second, > 0); the windows: limit (>= 1)
ARGV[3]  token_bucket: burst (>= 1); the windows: window_ms (> 0)
ARGV[4]  amount: tokens (requests) to charge more, a whole number; negative gives back
ARGV[5]  now in milliseconds (optional, decimals allowed; absent or empty: the Redis server clock)

Returns {balance, reset_ms}, integers:
  balance   tokens (requests) left after the charge; negative: the debt
  reset_ms  how long until the key holds its whole quota again (rounded up)

  token_bucket            the TAT moves forward by amount * 1000 / rate ms, with no bound: past
                          the tolerance (burst * 1000 / rate) it is debt. The bucket's checks
                          must pass `debt` (token_bucket.lua's ARGV[4]) or they would clamp it.
                          A give-back moves the TAT back, never before now (a full bucket, which
                          is no key).
  fixed_window            amount more in the count of the window that holds now, never below 0;
                          a count past the limit refuses until the window ends
  sliding_window_counter  amount more in the current window's count, never below 0; it weighs in
                          the estimate of this window and the next, so a large charge refuses
                          into the next window

Try it: redis-cli --eval lua/token_bucket.lua tollgate:demo:bob , 100 100 1 debt
        redis-cli --eval lua/charge.lua tollgate:demo:bob , token_bucket 100 100 149
        redis-cli --eval lua/token_bucket.lua tollgate:demo:bob , 100 100 1 debt
The second answers about {-50, 1500}: 50 tokens in debt, whole again in 1.5 s; the third is
refused with retry_after_ms about 510, the debt and its own token repaid at 100 a second.
(Less by the milliseconds between the calls: the server's clock runs on.)
]]

-- Comparisons allow 1 microsecond, as in token_bucket.lua.
local EPS = 0.001
-- Keys written on a caller's time are kept this much longer (see token_bucket.lua).
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
local kind = ARGV[1]
local a = num(ARGV[2])
local b = num(ARGV[3])
local amount = num(ARGV[4])
local now, slack = now_ms(ARGV[5])
local kinds = {token_bucket = 'string', fixed_window = 'hash', sliding_window_counter = 'hash'}
if key == nil or #ARGV > 5 or kinds[kind] == nil or a == nil or a <= 0 or b == nil or b <= 0
    or amount == nil or amount ~= math.floor(amount) or now == nil then
  return redis.error_reply('usage: charge.lua KEY , token_bucket|fixed_window|sliding_window_counter RATE|LIMIT BURST|WINDOW_MS AMOUNT [NOW_MS]')
end
-- A key of another type was left under this name by another algorithm (a reload changed the
-- limit's algorithm and kept its name): its state means nothing here, as in the checks.
local held_type = redis.call('TYPE', key).ok
if held_type ~= 'none' and held_type ~= kinds[kind] then
  redis.call('DEL', key)
end

if kind == 'token_bucket' then
  local interval = 1000 / a
  local tolerance = b * interval
  local tat = tonumber(redis.call('GET', key))
  if tat == nil or tat < now then
    tat = now
  end
  -- (no bound above: that is the debt; a give-back stops at a full bucket)
  tat = math.max(tat + amount * interval, now)
  local held = math.min(b, math.floor((tolerance - (tat - now) + EPS) / interval))
  local reset = math.max(0, math.ceil(tat - now))
  if tat - now <= EPS then
    -- a full bucket is no bucket
    redis.call('DEL', key)
  else
    redis.call('SET', key, string.format('%.17g', tat), 'PX', math.max(1, math.ceil(tat - now)) + slack)
  end
  return {held, reset}
end

local limit, window = a, b
local start = math.floor(now / window) * window
local window_end = start + window
local stored = redis.call('HMGET', key, 'w', 'c', 'p')
local w = tonumber(stored[1])
local curr = tonumber(stored[2]) or 0

if kind == 'fixed_window' then
  if w ~= start then
    curr = 0
  end
  curr = math.max(0, curr + amount)
  local reset = math.max(1, math.ceil(window_end - now))
  redis.call('HSET', key, 'w', string.format('%.17g', start), 'c', curr)
  redis.call('PEXPIRE', key, reset + slack)
  return {limit - curr, reset}
end

-- sliding_window_counter: the counts rotate as in its check
local prev = tonumber(stored[3]) or 0
if w ~= start then
  if w == start - window then
    prev = curr
  else
    prev = 0
  end
  curr = 0
end
curr = math.max(0, curr + amount)
redis.call('HSET', key, 'w', string.format('%.17g', start), 'c', curr, 'p', prev)
redis.call('PEXPIRE', key, math.max(1, math.ceil(window_end + window - now)) + slack)
local estimate = prev * (window - now + start) / window + curr
-- this window's count weighs until the next one ends; the previous one's until this ends
local reset = math.max(1, math.ceil(window_end - now))
if curr > 0 then
  reset = math.max(1, math.ceil(window_end + window - now))
end
return {math.floor(limit - estimate), reset}
