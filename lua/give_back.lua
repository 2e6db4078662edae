--[[ give_back.lua: undoes one admitted check of the five limit scripts. When a request passes
one limit and a later limit of its route refuses it, the request is not sent, so what the first
limit's check took is given back: a request that was refused costs no limit anything (as nginx
charges its limit_req zones only when all of them pass).

KEYS[1]  the key the check ran on
ARGV[1]  the check's algorithm: token_bucket | leaky_bucket | fixed_window | sliding_window |
         sliding_window_counter
ARGV[2]  what the check took, in ms of the schedule: token_bucket cost * 1000 / rate,
         leaky_bucket 1000 / rate; the windows: window_ms
ARGV[3]  age_ms: how long ago the check ran (optional, default 0; the windows find the window it
         counted in, or the sliding window's entry, at now - age_ms); for leaky_bucket how long
         ago the slot it took was (negative: a slot still ahead, the check's delay not over).
         A caller measuring it from when the check's answer came has now - age_ms late by the
         round trips, never early: the rules below allow for that, on the safe side.
ARGV[4]  now in milliseconds (optional, decimals allowed; absent or empty: the Redis server clock)

Returns 1 when something was given back, 0 when nothing of the check's was left: the window it
counted in is over, the bucket is full again, the key expired or holds another type.

  token_bucket                the stored TAT moves back by ARGV[2], never before now (tokens
                              are all alike: checks made since keep theirs)
  leaky_bucket                the next free slot moves back by ARGV[2] if the slot given back
                              is still the last one handed out (it lies at now - age_ms or up
                              to half an interval before); a slot in the middle of the schedule
                              stays taken (reusing it would send two requests at once)
  fixed_window, sliding_window_counter
                              one less in the window that holds now - age_ms, if still kept and
                              now - age_ms is past its first 50 ms (or half of it): before that
                              the check may have been in the window before, and stays counted
  sliding_window              the newest entry at or before now - age_ms leaves the log

Try it: redis-cli --eval lua/token_bucket.lua tollgate:demo:alice , 10 20
        redis-cli --eval lua/give_back.lua tollgate:demo:alice , token_bucket 100
]]

local EPS = 0.001
local SKEW_MS = 10000
-- slack comparing a slot with now - age_ms (delays are rounded to the microsecond)
local AGE_EPS = 0.01
-- ms after a window's start within which a check's window is not certain (see below)
local MARGIN = 50

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
local taken = num(ARGV[2])
local age = num(ARGV[3] ~= nil and ARGV[3] ~= '' and ARGV[3] or '0')
local now, slack = now_ms(ARGV[4])
local kinds = {token_bucket = 'string', leaky_bucket = 'string', fixed_window = 'hash',
  sliding_window = 'zset', sliding_window_counter = 'hash'}
if key == nil or #ARGV > 4 or kinds[kind] == nil or taken == nil or taken <= 0 or age == nil or now == nil then
  return redis.error_reply('usage: give_back.lua KEY , ALGORITHM TAKEN_MS>0 [AGE_MS] [NOW_MS]')
end
if redis.call('TYPE', key).ok ~= kinds[kind] then
  return 0
end
local at = now - age

if kinds[kind] == 'string' then
  local back = tonumber(redis.call('GET', key))
  -- (a TAT or next slot now or past: the bucket is full, the schedule idle, nothing is held)
  if back == nil or back - now <= EPS then
    return 0
  end
  -- (the last slot lies at `at` or up to half an interval before it: `at` is late by the
  -- round trips, never early)
  if kind == 'leaky_bucket' and (back - taken - at > AGE_EPS or at - (back - taken) > taken / 2) then
    return 0
  end
  back = back - taken
  if back - now <= EPS then
    redis.call('DEL', key)
  else
    redis.call('SET', key, string.format('%.17g', back), 'PX', math.max(1, math.ceil(back - now)) + slack)
  end
  return 1
end

if kind == 'sliding_window' then
  local newest = redis.call('ZREVRANGEBYSCORE', key, string.format('%.17g', at), '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
  -- (an entry a window old no longer counts)
  if newest[1] == nil or tonumber(newest[2]) <= now - taken then
    return 0
  end
  -- the entries of one time are named time:0, time:1, ... (sliding_window.lua counts them to
  -- name the next): the last of them leaves, so the next name is free again
  local time = string.match(newest[1], '^(.*):%d+$')
  local same = redis.call('ZCOUNT', key, newest[2], newest[2])
  redis.call('ZREM', key, time .. ':' .. (same - 1))
  return 1
end

local window = taken
local counted = math.floor(at / window) * window
-- so soon after the window's start that the check may have been in the one before: it stays
-- counted where it was
if at - counted < math.min(MARGIN, window / 2) then
  return 0
end
local stored = redis.call('HMGET', key, 'w', 'c', 'p')
local w = tonumber(stored[1])
if kind == 'fixed_window' then
  local count = tonumber(stored[2]) or 0
  -- (a window that is over holds nothing)
  if w ~= counted or count <= 0 or w + window <= now then
    return 0
  end
  redis.call('HSET', key, 'c', count - 1)
  redis.call('PEXPIRE', key, math.max(1, math.ceil(w + window - now)) + slack)
  return 1
end
-- sliding_window_counter: the check's count is the current window's, or the previous one's once
-- the window has moved on
-- (a count two windows old weighs nothing)
if counted + 2 * window <= now then
  return 0
end
local field
if w == counted then
  field = 'c'
elseif w == counted + window then
  field = 'p'
else
  return 0
end
local held = tonumber(stored[field == 'c' and 2 or 3]) or 0
if held <= 0 then
  return 0
end
redis.call('HSET', key, field, held - 1)
redis.call('PEXPIRE', key, math.max(1, math.ceil(w + 2 * window - now)) + slack)
return 1
