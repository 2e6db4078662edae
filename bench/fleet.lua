-- wrk script for bench/fleet: load spread over N tollgate instances, many client keys and one
-- hot key.
--
-- FLEET_PORTS="p1 p2 ..."  the instances' ports: thread i sends to instance i mod N
-- FLEET_KEYS=100000         distinct client keys (X-Api-Key: k1 … kKEYS), picked at random
-- FLEET_HOT=0.1             share of requests with X-Api-Key: hot
-- FLEET_GLOBAL=0.1          share of requests to /global (one limit shared by every client)
--
-- done(): the BENCH line with the run's totals, as bench/wrk.lua prints (bench_line.lua).

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

-- done(): the BENCH line, from bench_line.lua beside this script
dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "bench_line.lua")
