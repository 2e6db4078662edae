--[[ token_bucket.lua: a token bucket, refilled lazily from elapsed time (GCRA layout).

KEYS[1]  the bucket's key, e.g. tollgate:<route>:<limit>:<client>
ARGV[1]  rate: tokens added per second (> 0; decimals allowed, 0.05 is 3 per minute)
ARGV[2]  burst: the bucket's size (>= 1); a full bucket admits exactly `burst` requests at once
ARGV[3]  cost: tokens this request takes (optional, default 1)
ARGV[4]  the word `debt` (optional, after a written cost): the limit charges after the response
         (charge.lua), so a TAT past the tolerance is debt to repay, not a bucket left by other
         parameters to clamp (see `emptied` below)
ARGV[4]  now in milliseconds (optional, decimals allowed; absent or empty: the Redis server clock);
         ARGV[5] after `debt`: now is always the last argument

KEYS[2..]  more buckets with the same rate, burst and cost (optional): each is decided as if by a
          call of its own, at the same `now`, and the reply is one such array per key, in order.
          (tollgate sends the checks of different clients that wait together this way: one
          script call for them all instead of one each.)

Returns {allowed 1|0, remaining, retry_after_ms, reset_ms}, all integers:
  remaining       tokens left after this request; when refused, the tokens the bucket holds
                  (fewer than `cost`: a request of a smaller cost could still pass)
  retry_after_ms  0 when allowed; else how long until this request would be admitted (rounded up)
  reset_ms        how long until the bucket is full again (rounded up)

The stored value is the bucket's "theoretical arrival time" (TAT): the instant at which the bucket
would be full again. With interval = 1000/rate ms per token, a bucket holding n tokens at `now`
has TAT = now + (burst - n) * interval. Taking `cost` tokens moves TAT forward by cost * interval,
which is allowed while TAT - now stays within burst * interval (the GCRA tolerance). One number
per key, written with %.17g so it reads back exactly, and it expires when the bucket is full.

Try it: redis-cli --eval lua/token_bucket.lua tollgate:demo:alice , 10 20
        redis-cli --eval lua/token_bucket.lua tollgate:demo:alice , 10 20 1 debt
Debug:  redis-cli --ldb --eval lua/token_bucket.lua tollgate:demo:alice , 10 20
]]

-- Comparisons allow 1 microsecond: timestamps near 1.7e12 ms carry about 0.25 us of rounding,
-- and a request that arrives within 1 us of its slot must not be refused for that.
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

local rate = num(ARGV[1])
local burst = num(ARGV[2])
local cost = 1
if ARGV[3] ~= nil and ARGV[3] ~= '' then
  cost = num(ARGV[3])
end
local debt = ARGV[4] == 'debt'
local last = debt and 5 or 4
local now, slack = now_ms(ARGV[last])
if KEYS[1] == nil or #ARGV > last or rate == nil or rate <= 0 or burst == nil or burst < 1 or cost == nil or cost < 0 or now == nil then
  return redis.error_reply('usage: token_bucket.lua KEY [KEY...] , RATE>0 BURST>=1 [COST] [debt] [NOW_MS]')
end

local interval = 1000 / rate
local tolerance = burst * interval

-- With several keys, a key the script cannot write answers its own error and the others go
-- on: pcall, so that one bad key does not stop the script half-way, with the keys before it
-- already written (a caller would then run those again).
-- Writes a bucket's TAT, kept `ahead` ms (the time until it is full again); the error reply
-- when the key cannot be written, else nil.
local function put(key, tat, ahead)
  local set = redis.pcall('SET', key, string.format('%.17g', tat), 'PX', math.max(1, math.ceil(ahead)) + slack)
  if type(set) == 'table' and set.err then
    return set
  end
  return nil
end

local function take(key)
  local got = redis.pcall('GET', key)
  if type(got) == 'table' and got.err then
    -- A key of another type was left under this name by another algorithm (a reload changed
    -- the limit's algorithm and kept its name): its state means nothing here, so the bucket
    -- starts full, as in the memory store, instead of failing every call until it expires.
    redis.call('DEL', key)
    got = nil
  end
  local tat = tonumber(got)
  if tat == nil or tat < now then
    tat = now
  end
  -- A bucket written under other parameters (its limit changed by a reload) may lie further
  -- ahead than this bucket holds: it is empty now, written so (also when this request is
  -- refused), and refills at the rate given here from now on. A charged bucket's TAT that far
  -- ahead is debt, which stays.
  local emptied = not debt and tat - now - tolerance > EPS
  if emptied then
    tat = now + tolerance
  end
  -- after: how far ahead of now the bucket's TAT would be if this request took its tokens
  local after = tat - now + cost * interval
  if after - tolerance > EPS then
    -- (capped as below)
    local held = math.floor((tolerance - (tat - now) + EPS) / interval)
    held = math.max(0, math.min(math.floor(burst), held))
    local failed = emptied and put(key, tat, tolerance)
    if failed then
      return failed
    end
    return {0, held, math.max(1, math.ceil(after - tolerance - EPS)), math.ceil(tat - now)}
  end
  local failed = put(key, now + after, after)
  if failed then
    return failed
  end
  -- (EPS is in ms: past 1 000 000 tokens a second it is worth more than a token, so the count is
  -- capped at what a full bucket keeps after this request, and at 0 when that is none)
  local remaining = math.floor((tolerance - after + EPS) / interval)
  remaining = math.max(0, math.min(math.floor(burst - cost), remaining))
  return {1, remaining, 0, math.ceil(after)}
end

if #KEYS == 1 then
  return take(KEYS[1])
end
local replies = {}
for i = 1, #KEYS do
  replies[i] = take(KEYS[i])
end
return replies
