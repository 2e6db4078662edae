#!/usr/bin/env python3
"""Prints bench/run's results as Markdown tables, with the performance targets checked.

usage: report.py RESULTS.tsv   (flood and idle-connection figures come from the environment)

RESULTS.tsv columns: kind name threads round rps p50_us p99_us requests non2xx sockerr notes
user_us system_us (the last two: CPU per request in each mode, when measured).
With several rounds, each figure is the median over the rounds, and a target that compares two
rows is decided on the median of their per-round ratios: the two rows of a pair run one after the
other in every round, so a ratio taken within a round cancels how the machine's speed drifts
between rounds (on a shared VM the same binary moves 10-30 % from one minute to the next).
"""

import os
import sys
from collections import OrderedDict
from statistics import median

NGINX = "nginx proxy_pass"
NGINX_LIMIT = "nginx limit_req"
HAPROXY = "HAProxy http-reuse"
PLAIN = "tollgate no limits"
REDIS = "tollgate Redis bucket"


def load(path):
    rows = OrderedDict()
    with open(path) as f:
        for line in f:
            cols = line.rstrip("\n").split("\t")
            if len(cols) < 11:
                continue
            kind, name, threads, rnd, rps, p50, p99, reqs, non2xx, sockerr, notes = cols[:11]
            key = (kind, name, int(threads))
            r = rows.setdefault(key, {"rps": [], "p50": [], "p99": [], "reqs": 0, "non2xx": 0,
                                      "sockerr": 0, "notes": [], "by_round": {}, "user": [],
                                      "system": []})
            if len(cols) >= 13 and cols[11] and cols[12]:
                r["user"].append(float(cols[11]))
                r["system"].append(float(cols[12]))
            r["rps"].append(float(rps))
            r["by_round"][rnd] = float(rps)
            r["p50"].append(float(p50))
            r["p99"].append(float(p99))
            r["reqs"] += int(reqs)
            r["non2xx"] += int(non2xx)
            r["sockerr"] += int(sockerr)
            if notes and notes not in r["notes"]:
                r["notes"].append(notes)
    for r in rows.values():
        r["notes"] = merge_notes(r["notes"])
        r["rounds"] = len(r["rps"])
        for k in ("rps", "p50", "p99"):
            r[k] = median(r[k])
        # CPU per request: the median over the rounds of each part, and of their sum
        cpu = [u + s for u, s in zip(r["user"], r["system"])]
        r["cpu"] = median(cpu) if cpu else None
        r["user"] = median(r["user"]) if r["user"] else None
        r["system"] = median(r["system"]) if r["system"] else None
    return rows


def merge_notes(notes):
    """The distinct notes of a row's rounds as one: figures of the same label become a range
    ("Redis calls/req 0.08–0.09"); notes that are not "label number, ..." are joined as they are."""
    figures = OrderedDict()
    for note in notes:
        for item in note.split(", "):
            label, _, value = item.rpartition(" ")
            try:
                figures.setdefault(label, []).append(float(value))
            except ValueError:
                return notes
    merged = []
    for label, values in figures.items():
        lo, hi = min(values), max(values)
        text = (lambda x: f"{x:.0f}") if all(v.is_integer() for v in values) else (lambda x: f"{x:.2f}")
        merged.append(f"{label} {text(lo)}" if lo == hi else f"{label} {text(lo)}–{text(hi)}")
    return [", ".join(merged)] if merged else []


def ms(us):
    return f"{us / 1000:.2f}"


def cpu_text(us):
    return "-" if us is None else f"{us:.2f}"


def num(x):
    return f"{x:,.0f}".replace(",", " ")


def paired(a, b):
    """a's requests/s over b's, round by round (the rounds both ran), and their median; the
    ratio of the two medians when no round has both."""
    ratios = [a["by_round"][k] / b["by_round"][k]
              for k in a["by_round"] if b["by_round"].get(k)]
    if not ratios:
        return a["rps"] / b["rps"], ""
    if len(ratios) == 1:
        return ratios[0], ""
    each = " ".join(f"{x:.2f}" for x in ratios)
    return median(ratios), f"; per round {each}, ratio of medians {a['rps'] / b['rps']:.2f}"


def mark(ok, *rows):
    """✔ or ✘; a figure from a run with non-2xx answers or socket errors never passes."""
    if any(r["non2xx"] or r["sockerr"] for r in rows):
        return "✘ (that run had errors)"
    return "✔" if ok else "✘"


def main():
    rows = load(sys.argv[1])
    env = os.environ
    proxies = [(k, r) for k, r in rows.items() if k[0] == "proxy"]
    threads_seen = sorted({k[2] for k, _ in proxies})
    rounds = max((r["rounds"] for _, r in proxies), default=1)

    if proxies:
        print()
        print("### Proxies" + (f" (median of {rounds} rounds)" if rounds > 1 else ""))
        print()
        print("| proxy | threads | requests/s | p50 ms | p99 ms | vs nginx proxy_pass "
              "| non-2xx | socket errors | notes |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
        for threads in threads_seen:
            ref = rows.get(("proxy", NGINX, threads))
            for (kind, name, t), r in proxies:
                if t != threads:
                    continue
                ratio = f"{r['rps'] / ref['rps']:.2f}" if ref and ref["rps"] else "-"
                print(f"| {name} | {t} | {num(r['rps'])} | {ms(r['p50'])} | {ms(r['p99'])} "
                      f"| {ratio} | {num(r['non2xx'])} | {num(r['sockerr'])} "
                      f"| {'; '.join(r['notes'])} |")

    single = [(k, r) for k, r in rows.items() if k[0] == "single"]
    if single:
        print()
        print("### One worker each, `wrk -t1`" + (f" (median of {rounds} rounds)" if rounds > 1 else ""))
        print()
        print("| proxy, connections | requests/s | vs HAProxy | CPU µs/request | user | system "
              "| p99 ms | non-2xx | socket errors |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for (kind, name, t), r in single:
            conns = name.rsplit(", ", 1)[1]
            ref = rows.get(("single", f"{HAPROXY}, {conns}", t))
            ratio = f"{r['rps'] / ref['rps']:.2f}" if ref and ref["rps"] else "-"
            print(f"| {name} | {num(r['rps'])} | {ratio} | {cpu_text(r['cpu'])} "
                  f"| {cpu_text(r['user'])} | {cpu_text(r['system'])} | {ms(r['p99'])} "
                  f"| {num(r['non2xx'])} | {num(r['sockerr'])} |")

    paced = [(k, r) for k, r in rows.items() if k[0] == "paced"]
    if paced:
        print()
        share = env.get("PACED_SHARE")
        why = f"{float(share):.0%} of HAProxy's one-worker maximum" if share else "BENCH_PACED_RATE"
        print(f"### At a fixed load: {num(float(env.get('PACED_RATE') or 0))} requests/s ({why}), "
              f"{env.get('PACED_CONNS', '?')} connections, one worker each")
        print()
        print("Latency counts from when each request was due, so a stall counts for every "
              "request behind it.")
        print()
        print("| proxy | served/s | p50 ms | p99 ms | CPU µs/request | errors | never answered "
              "| notes |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
        for (kind, name, t), r in paced:
            print(f"| {name} | {num(r['rps'])} | {ms(r['p50'])} | {ms(r['p99'])} "
                  f"| {cpu_text(r['cpu'])} | {num(r['non2xx'])} | {num(r['sockerr'])} "
                  f"| {'; '.join(r['notes'])} |")

    bad = [(k, r) for k, r in rows.items() if r["non2xx"] or r["sockerr"]]
    bad = [(k, r) for k, r in bad if k[0] != "flood"]
    if bad:
        print()
        print("**Warning**: runs with non-2xx answers or socket errors (a proxy answering errors "
              "fast is not a win):")
        for (kind, name, t), r in bad:
            print(f"- {name}, {t} thread(s): {num(r['non2xx'])} non-2xx of {num(r['reqs'])}, "
                  f"{num(r['sockerr'])} socket errors")

    print()
    print("### Targets")
    print()

    def get(name, t):
        return rows.get(("proxy", name, t))

    for t in threads_seen:
        plain, hap, redis = get(PLAIN, t), get(HAPROXY, t), get(REDIS, t)
        ngx, ngx_lim = get(NGINX, t), get(NGINX_LIMIT, t)
        if plain and hap:
            ratio, rounds_said = paired(plain, hap)
            print(f"- {t} thread(s): tollgate no limits ≥ HAProxy requests/s: "
                  f"{num(plain['rps'])} vs {num(hap['rps'])} "
                  f"({ratio:.2f}{rounds_said}) {mark(ratio >= 1.0, plain, hap)}")
        if plain and hap and plain["cpu"] and hap["cpu"]:
            print(f"- {t} thread(s): tollgate no limits CPU per request ≤ HAProxy's: "
                  f"{cpu_text(plain['cpu'])} µs vs {cpu_text(hap['cpu'])} µs "
                  f"{mark(plain['cpu'] <= hap['cpu'], plain, hap)}")
        if plain and redis:
            ratio, rounds_said = paired(redis, plain)
            print(f"- {t} thread(s): Redis bucket ≥ 0.95 of tollgate no limits: "
                  f"{ratio:.2f}{rounds_said} {mark(ratio >= 0.95, plain, redis)}")
        if plain and ngx:
            ok = plain["p99"] <= ngx["p99"]
            print(f"- {t} thread(s): p99 no worse than nginx, no limits vs proxy_pass: "
                  f"{ms(plain['p99'])} ms vs {ms(ngx['p99'])} ms {mark(ok, plain, ngx)}")
        if redis and ngx_lim:
            ok = redis["p99"] <= ngx_lim["p99"]
            print(f"- {t} thread(s): p99 no worse than nginx, Redis bucket vs limit_req: "
                  f"{ms(redis['p99'])} ms vs {ms(ngx_lim['p99'])} ms {mark(ok, redis, ngx_lim)}")

    for (kind, name, t), r in single:
        base, conns = name.rsplit(", ", 1)
        hap = rows.get(("single", f"{HAPROXY}, {conns}", t))
        if base != PLAIN or not hap:
            continue
        ratio, rounds_said = paired(r, hap)
        print(f"- one worker, wrk -t1 {conns}: tollgate no limits ≥ HAProxy requests/s: "
              f"{num(r['rps'])} vs {num(hap['rps'])} ({ratio:.2f}{rounds_said}) "
              f"{mark(ratio >= 1.0, r, hap)}")
        if r["cpu"] and hap["cpu"]:
            print(f"- one worker, wrk -t1 {conns}: CPU per request ≤ HAProxy's: "
                  f"{cpu_text(r['cpu'])} µs (user {cpu_text(r['user'])}, system "
                  f"{cpu_text(r['system'])}) vs {cpu_text(hap['cpu'])} µs (user "
                  f"{cpu_text(hap['user'])}, system {cpu_text(hap['system'])}) "
                  f"{mark(r['cpu'] <= hap['cpu'], r, hap)}")
    fixed = dict((k[1], r) for k, r in paced)
    if PLAIN in fixed and NGINX in fixed:
        a, b = fixed[PLAIN], fixed[NGINX]
        print(f"- fixed load: tollgate no limits p99 ≤ nginx proxy_pass's: {ms(a['p99'])} ms "
              f"vs {ms(b['p99'])} ms {mark(a['p99'] <= b['p99'], a, b)}")

    if env.get("FLOOD_REQUESTS"):
        reqs = int(env["FLOOD_REQUESTS"])
        denied = int(env["FLOOD_DENIED"])
        redis_calls = int(env["FLOOD_REDIS"])
        hits = int(env["FLOOD_HITS"])
        share = 1 - redis_calls / reqs if reqs else 0.0
        flood = [r for k, r in rows.items() if k[0] == "flood"]
        rps = f", {num(flood[0]['rps'])} requests/s" if flood else ""
        print(f"- deny-cache flood (one client, 1/s bucket in Redis): {num(reqs)} requests"
              f"{rps}, {num(denied)} denied (non-2xx), {num(redis_calls)} Redis EVAL/EVALSHA "
              f"calls: {share:.1%} answered without Redis (deny-cache hits counted by tollgate: "
              f"{hits / reqs if reqs else 0:.1%}) — target ≥ 90 % {mark(share >= 0.9)}")

    if env.get("I_RSS"):
        rss = int(env["I_RSS"]) / 1024
        before = int(env["I_BEFORE"]) / 1024
        n = int(env["IDLE_CONNS"])
        opened, served, still = env["I_OPENED"], env["I_SERVED"], env["I_OPEN"]
        complete = int(served) == n and int(still) == n
        print(f"- RSS with {num(n)} idle keep-alive connections: {rss:.1f} MB "
              f"({before:.1f} MB before them; {opened} opened, {served} answered 200, "
              f"{still} still open when measured) — target < 150 MB "
              f"{mark(rss < 150 and complete)}"
              + ("" if complete else " (not every connection was served and kept open)"))

    keys = [(k, r) for k, r in rows.items() if k[0] == "keys"]
    if keys:
        print()
        print("### Distinct client keys (X-Forwarded-For varied by wrk)")
        print()
        print("| store, keys | threads | requests/s | p50 ms | p99 ms | vs 1 key "
              "| non-2xx | socket errors | notes |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
        base = {}
        for (kind, name, t), r in keys:
            backend = name.split(",")[0]
            base.setdefault(backend, r["rps"])
            ratio = r["rps"] / base[backend] if base[backend] else 0
            print(f"| {name} | {t} | {num(r['rps'])} | {ms(r['p50'])} | {ms(r['p99'])} "
                  f"| {ratio:.2f} | {num(r['non2xx'])} | {num(r['sockerr'])} "
                  f"| {'; '.join(r['notes'])} |")


if __name__ == "__main__":
    main()
