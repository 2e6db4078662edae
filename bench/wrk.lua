-- wrk script for bench/run.
--
-- done(): the BENCH line with the run's totals and latency percentiles (bench_line.lua).
--
-- BENCH_KEYS=N (optional): each request carries X-Forwarded-For 10.a.b.c, cycling through N
-- distinct addresses (threads start at different offsets), so a proxy that trusts loopback
-- sees N distinct clients. Without it wrk sends its one pre-built request.
--
-- BENCH_BODY=N (optional): requests are POSTs with an N-byte body (pgo/train uses it).

local keys = tonumber(os.getenv("BENCH_KEYS") or "")
local body = tonumber(os.getenv("BENCH_BODY") or "")

if body and body > 0 then
   wrk.method = "POST"
   wrk.body = string.rep("x", body)
   wrk.headers["Content-Type"] = "application/octet-stream"
end

local next_id = 0
function setup(thread)
   thread:set("thread_id", next_id)
   next_id = next_id + 1
end

if keys and keys > 0 then
   local n = 0
   local floor = math.floor
   -- a headers table given to wrk.format replaces wrk.headers: one copy of them per thread,
   -- made once, with the address changed per request
   local headers = {}
   function init(args)
      -- spread the threads over the key space
      n = floor((thread_id or 0) * keys / 7) % keys
      for k, v in pairs(wrk.headers) do headers[k] = v end
   end
   function request()
      n = n + 1
      if n >= keys then n = 0 end
      headers["X-Forwarded-For"] = string.format("10.%d.%d.%d", floor(n / 65536) % 256, floor(n / 256) % 256, n % 256)
      return wrk.format(nil, nil, headers)
   end
end

-- done(): the BENCH line, from bench_line.lua beside this script
dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "bench_line.lua")
