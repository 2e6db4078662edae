-- The BENCH line, loaded by bench/wrk.lua and bench/fleet.lua: wrk's done() prints the run's
-- totals and latency percentiles in microseconds on one machine-readable line (wrk's own text
-- rounds them and changes units). bench/run, bench/ab and bench/fleet read it.

function done(summary, latency, requests)
   local e = summary.errors
   io.write(string.format(
      "BENCH requests=%d duration_us=%d connect=%d read=%d write=%d status=%d timeout=%d p50_us=%d p90_us=%d p99_us=%d max_us=%d\n",
      summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
      latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
