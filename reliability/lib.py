"""Shared pieces of the reliability scripts: processes (redis-server, the timestamping
upstream, tollgate, the load generator) on free loopback ports, metrics scraping, and small
statistics. Everything runs on 127.0.0.1; every process started here is stopped by its pid.
"""

import atexit
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TOOLS_DIR = os.path.join(HERE, "tools")
TOOLS = os.path.join(TOOLS_DIR, "target", "release")
TOLLGATE = os.environ.get("TOLLGATE_BIN", os.path.join(ROOT, "target", "release", "tollgate"))


def log(*args):
    print(time.strftime("%H:%M:%S"), *args, flush=True)


def build():
    """Builds the release tollgate (unless TOLLGATE_BIN is given) and the tools."""
    if "TOLLGATE_BIN" not in os.environ:
        subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
    subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=TOOLS_DIR, check=True)
    # Run a private copy: others may rebuild target/release/tollgate during a long run.
    global TOLLGATE
    snap = os.path.join(tempfile.gettempdir(), f"tollgate-reliability-{os.getpid()}")
    shutil.copy2(TOLLGATE, snap)
    atexit.register(lambda: os.path.exists(snap) and os.remove(snap))
    TOLLGATE = snap
    for tool in ("redis-server", "redis-cli"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is missing: apt-get install redis-server redis-tools")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(pred, timeout, what, step=0.01):
    deadline = time.time() + timeout
    while not pred():
        if time.time() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(step)


def machine():
    """A one-line description of the machine and its load right now."""
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    load = open("/proc/loadavg").read().split()[:3]
    return f"{os.cpu_count()} cores ({cpu}), load average {' '.join(load)}"


class Workdir:
    def __init__(self, name):
        base = os.environ.get("RELIABILITY_WORKDIR")
        self.path = tempfile.mkdtemp(prefix=f"tollgate-{name}-", dir=base)

    def file(self, name):
        return os.path.join(self.path, name)


def _ping(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
            s.sendall(b"PING\r\n")
            return s.recv(7) == b"+PONG\r\n"
    except OSError:
        return False


class Redis:
    def __init__(self, workdir, port=None, extra=()):
        self.port = port or free_port()
        self.dir = workdir.file(f"redis-{self.port}")
        os.makedirs(self.dir, exist_ok=True)
        self.extra = list(extra)
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--protected-mode", "no", "--dir", self.dir,
             "--enable-debug-command", "local", *self.extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: _ping(self.port), 10, f"redis on {self.port}")
        return self

    def url(self):
        return f"redis://127.0.0.1:{self.port}/0"

    def kill(self):
        if self.proc:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def signal(self, sig):
        os.kill(self.proc.pid, sig)

    def cli(self, *args, timeout=30):
        out = subprocess.run(["redis-cli", "-p", str(self.port), *args],
                             capture_output=True, text=True, timeout=timeout)
        return out.stdout.strip()

    def pid(self):
        return self.proc.pid


class Sentinel:
    """A `redis-server --sentinel` watching the master `name` at `master_port`, quorum 2."""

    def __init__(self, workdir, name, master_port, down_after_ms=500, failover_timeout_ms=2000):
        self.port = free_port()
        self.name = name
        self.config = workdir.file(f"sentinel-{self.port}.conf")
        with open(self.config, "w") as f:
            f.write(f"port {self.port}\nbind 127.0.0.1\nprotected-mode no\n"
                    f"dir {workdir.path}\n"
                    f"sentinel monitor {name} 127.0.0.1 {master_port} 2\n"
                    f"sentinel down-after-milliseconds {name} {down_after_ms}\n"
                    f"sentinel failover-timeout {name} {failover_timeout_ms}\n")
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(["redis-server", self.config, "--sentinel"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: _ping(self.port), 10, f"sentinel on {self.port}")
        return self

    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def cli(self, *args, timeout=10):
        out = subprocess.run(["redis-cli", "-p", str(self.port), *args],
                             capture_output=True, text=True, timeout=timeout)
        return out.stdout.strip()

    def master_port(self):
        """The master's port as this Sentinel names it, or None."""
        lines = self.cli("SENTINEL", "get-master-addr-by-name", self.name).splitlines()
        return int(lines[1]) if len(lines) == 2 else None

    def ready(self, sentinels, replicas):
        """Whether it knows `sentinels` other Sentinels and `replicas` replicas."""
        lines = self.cli("SENTINEL", "master", self.name).splitlines()
        fields = dict(zip(lines[::2], lines[1::2]))
        return (fields.get("num-other-sentinels") == str(sentinels)
                and fields.get("num-slaves") == str(replicas))

    def kill(self):
        if self.proc:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


class Upstream:
    def __init__(self, workdir, port=None, log_file=None, delay_ms=0):
        self.port = port or free_port()
        self.log_file = log_file
        self.delay_ms = delay_ms
        self.proc = None

    def start(self):
        cmd = [os.path.join(TOOLS, "upstream"), "--listen", f"127.0.0.1:{self.port}"]
        if self.log_file:
            cmd += ["--log", self.log_file]
        if self.delay_ms:
            cmd += ["--delay-ms", str(self.delay_ms)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: _connects(self.port), 10, f"upstream on {self.port}")
        return self

    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def kill(self):
        if self.proc:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def stop(self):
        """SIGTERM: flushes the arrival log."""
        if self.proc:
            self.proc.terminate()
            self.proc.wait()
            self.proc = None

    def arrivals(self):
        """Arrival times (µs since the epoch) logged so far."""
        if not self.log_file or not os.path.exists(self.log_file):
            return []
        with open(self.log_file) as f:
            return [int(line) for line in f if line.strip()]


def _connects(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


_METRIC = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')


def parse_metrics(text):
    """{(name, labels-string): value}; labels as written, e.g. '{kind="timeout"}'."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = _METRIC.match(line)
        if m:
            out[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return out


def metric_sum(metrics, name, label_filter=""):
    return sum(v for (n, labels), v in metrics.items() if n == name and label_filter in labels)


class Tollgate:
    """A tollgate process with an admin listener; its stderr is kept with arrival times."""

    def __init__(self, workdir, name, yaml_text, port, admin_port, rust_log=None):
        self.name = name
        self.port = port
        self.admin_port = admin_port
        self.config = workdir.file(f"{name}.yaml")
        with open(self.config, "w") as f:
            f.write(yaml_text)
        self.log_path = workdir.file(f"{name}.log")
        self.rust_log = rust_log or "info,tollgate::access=off"
        self.lines = []  # (time.time(), line)
        self.proc = None

    def start(self):
        env = dict(os.environ, RUST_LOG=self.rust_log)
        self.proc = subprocess.Popen([TOLLGATE, "--config", self.config], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        threading.Thread(target=self._read_stderr, daemon=True).start()
        wait_until(lambda: self._healthy(), 20, f"tollgate {self.name} /healthz")
        return self

    def _read_stderr(self):
        with open(self.log_path, "a") as f:
            for line in self.proc.stderr:
                self.lines.append((time.time(), line.rstrip("\n")))
                f.write(line)
                f.flush()

    def _healthy(self):
        if self.proc.poll() is not None:
            raise RuntimeError(f"tollgate {self.name} exited; see {self.log_path}")
        try:
            return urllib.request.urlopen(
                f"http://127.0.0.1:{self.admin_port}/healthz", timeout=1).status == 200
        except OSError:
            return False

    def url(self, path="/"):
        return f"http://127.0.0.1:{self.port}{path}"

    def metrics(self):
        text = urllib.request.urlopen(
            f"http://127.0.0.1:{self.admin_port}/metrics", timeout=5).read().decode()
        return parse_metrics(text)

    def events(self, needle):
        return [t for t, line in self.lines if needle in line]

    def rss_kb(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def fds(self):
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def threads(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
        return 0

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode if self.proc else None


class MetricsPoller:
    """Scrapes a tollgate's /metrics every `interval` seconds in a thread, keeping
    (time, successful store calls, store errors by kind, requests by status)."""

    def __init__(self, tollgate, interval=0.05):
        self.tollgate = tollgate
        self.interval = interval
        self.samples = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            try:
                m = self.tollgate.metrics()
                t = time.time()
                calls = metric_sum(m, "tollgate_store_duration_seconds_count")
                errors = {}
                for (n, labels), v in m.items():
                    if n == "tollgate_store_errors_total":
                        errors[re.search(r'kind="([^"]*)"', labels).group(1)] = v
                self.samples.append((t, calls - sum(errors.values()), errors))
            except OSError:
                pass
            self._stop.wait(self.interval)

    def stop(self):
        self._stop.set()
        self._thread.join()

    def first_success_after(self, t0):
        """The first sample time after t0 at which successful store calls had grown since the
        last sample at or before t0 (that is: Redis decided a request again)."""
        before = [s for s in self.samples if s[0] <= t0]
        if not before:
            return None
        base = before[-1][1]
        for t, ok, _ in self.samples:
            if t > t0 and ok > base:
                return t
        return None


class Load:
    """The load generator as a subprocess; `result()` waits for it and returns its summary and
    its per-request records [(start_us, end_us, status, url_index, value_index)]."""

    def __init__(self, workdir, name, urls, duration, rate=0, concurrency=0, header=None,
                 timeout=30, progress=False, unique_header=None, requests=None):
        self.out = workdir.file(f"{name}.csv")
        cmd = [os.path.join(TOOLS, "loadgen"), "--duration", str(duration), "--out", self.out,
               "--timeout", str(timeout)]
        for u in urls:
            cmd += ["--url", u]
        if rate:
            cmd += ["--rate", str(rate)]
        else:
            cmd += ["--concurrency", str(concurrency)]
        if header:
            cmd += ["--header", header]
        if unique_header:
            cmd += ["--unique-header", unique_header]
        if requests:
            cmd += ["--requests", str(requests)]
        if progress:
            cmd += ["--progress"]
        self.started = time.time()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)

    def result(self):
        out, _ = self.proc.communicate()
        if self.proc.returncode != 0:
            raise RuntimeError(f"loadgen failed ({self.proc.returncode})")
        summary = json.loads(out.strip().splitlines()[-1])
        recs = []
        with open(self.out) as f:
            for line in f:
                a, b, s, u, v = line.split(",")
                recs.append((int(a), int(b), int(s), int(u), int(v)))
        return summary, recs


def percentile(values, p):
    if not values:
        return None
    v = sorted(values)
    i = max(1, min(len(v), int(-(-len(v) * p // 1)))) - 1
    return v[i]


def count_statuses(recs):
    out = {}
    for r in recs:
        out[r[2]] = out.get(r[2], 0) + 1
    return dict(sorted(out.items()))


def fmt_statuses(counts):
    names = {0: "conn-err", 1: "hang"}
    return " ".join(f"{names.get(s, s)}:{n}" for s, n in counts.items()) or "-"
