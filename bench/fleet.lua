-- wrk script for bench/fleet: load spread over N tollgate instances, many client keys and one
-- hot key.
--
-- FLEET_PORTS="p1 p2 ..."  the instances' ports: thread i sends to instance i mod N
-- FLEET_KEYS=100000         distinct client keys (X-Api-Key: k1 … kKEYS), picked at random
-- FLEET_HOT=0.1             share of requests with X-Api-Key: hot
-- FLEET_GLOBAL=0.1          share of requests to /global (one limit shared by every client)
--
-- done(): one machine-readable line with the run's totals, as bench/wrk.lua prints.

local ports = {}
for p in string.gmatch(os.getenv("FLEET_PORTS") or "", "%d+") do
   ports[#ports + 1] = p
end

local next_id = 0
function setup(thread)
   if #ports > 0 then
      thread.addr = wrk.lookup("127.0.0.1", ports[next_id % #ports + 1])[1]
   end
   thread:set("thread_id", next_id)
   next_id = next_id + 1
end

local keys = tonumber(os.getenv("FLEET_KEYS") or "") or 100000
local hot = tonumber(os.getenv("FLEET_HOT") or "") or 0.1
local global = tonumber(os.getenv("FLEET_GLOBAL") or "") or 0.1
local random = math.random
local headers = {}

function init(args)
   math.randomseed(os.time() * 1000 + (thread_id or 0) * 7919)
   -- a headers table given to wrk.format replaces wrk.headers: one copy per thread
   for k, v in pairs(wrk.headers) do headers[k] = v end
end

function request()
   if random() < hot then
      headers["X-Api-Key"] = "hot"
   else
      headers["X-Api-Key"] = "k" .. random(keys)
   end
   if random() < global then
      return wrk.format(nil, "/global", headers)
   end
   return wrk.format(nil, "/", headers)
end

function done(summary, latency, requests)
   local e = summary.errors
   io.write(string.format(
      "BENCH requests=%d duration_us=%d connect=%d read=%d write=%d status=%d timeout=%d p50_us=%d p90_us=%d p99_us=%d max_us=%d\n",
      summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
      latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
