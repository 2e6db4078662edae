#!/usr/bin/env python3
"""Resident memory of a proxy holding many idle keep-alive client connections.

usage: idle_conns.py HOST PORT COUNT PID

Opens COUNT connections to HOST:PORT, sends one GET on each and reads its whole response (so
each is a served HTTP/1.1 keep-alive connection, not just an accepted socket), leaves them all
idle, then reads VmRSS of process PID from /proc and checks how many connections are still open.
Prints one line: "IDLE opened=N served=N still_open=N rss_before_kb=N rss_kb=N hwm_kb=N fds=N".
"""

import os
import resource
import select
import socket
import sys
import time


def status(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0])
    return out


def read_response(s):
    """Reads one HTTP response with a Content-Length (or none: headers only); False on EOF."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(4096)
        if not chunk:
            return False
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v.strip())
    while len(body) < length:
        chunk = s.recv(4096)
        if not chunk:
            return False
        body += chunk
    return head.startswith(b"HTTP/1.1 2")


def main():
    host, port, count, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = count + 256
    if soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (max(want, hard), max(want, hard)))
        except (ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    before = status(pid)["VmRSS"]
    request = f"GET / HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()
    socks = []
    served = 0
    started = time.monotonic()
    # in batches: connect a batch, send on each, then read each answer
    batch = 100  # below the listen backlog (128 for tollgate), so no SYN is dropped
    for first in range(0, count, batch):
        group = []
        for _ in range(min(batch, count - first)):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.settimeout(30)
            s.connect((host, port))
            group.append(s)
        for s in group:
            s.sendall(request)
        for s in group:
            if read_response(s):
                served += 1
        socks.extend(group)
    elapsed = time.monotonic() - started
    time.sleep(1.0)
    st = status(pid)
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        fds = -1
    # a connection the proxy closed is readable (EOF); an open idle one is not
    poll = select.poll()
    by_fd = {}
    for s in socks:
        poll.register(s, select.POLLIN)
        by_fd[s.fileno()] = s
    closed = 0
    for fd, ev in poll.poll(0):
        s = by_fd[fd]
        s.setblocking(False)
        try:
            if not s.recv(1, socket.MSG_PEEK):
                closed += 1
        except OSError:
            closed += 1
    still_open = len(socks) - closed
    print(
        f"IDLE opened={len(socks)} served={served} still_open={still_open} "
        f"rss_before_kb={before} rss_kb={st['VmRSS']} hwm_kb={st['VmHWM']} fds={fds} "
        f"open_seconds={elapsed:.1f}",
        flush=True,
    )
    for s in socks:
        s.close()


if __name__ == "__main__":
    main()
