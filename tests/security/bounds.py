#!/usr/bin/env python3
"""Lock-out, starvation and the admin boundary against the real daemons
(issue 55 items 6 and 7).

Starts `symphony up --serve --transport tcp` (a scheduler, a frontend and a
backend as processes), then
  0. as a member (with the token) registers with the scheduler from
     127.0.0.1, answering its challenge only after 1000 idle connections
     from 127.0.0.2 made the scheduler evict registering links: it must be
     welcomed (on the session-start main c5f2d45 it was evicted: the oldest
     registering link went whatever its address);
and, as an attacker on the same host with no token:
  1. opens 1000 idle TCP connections to every port every daemon listens on
     (found in /proc, from 127.0.0.2 where it can bind), and while they are
     held checks that
       - every daemon's metrics endpoint answers `GET /health` within 1 s;
       - a new frontend with the cluster's join token still registers (the
         scheduler counts 2 frontends) and frontend 1 still serves an
         inference;
  2. trickles an HTTP request body (one byte a second): the frontend must
     answer 408 and close it within its body timeout (10 s) plus 3 s;
  3. checks that the idle gRPC connections of step 1 were closed by the
     frontend within its preface timeout (10 s) plus 3 s;
  4. unloads a model over HTTP without the admin credential: refused (403,
     `up` configures none) and the model still ready.
Every daemon must be alive at the end. Exit 0 when all hold; 1 with the
reason otherwise. Bounded in time (about 40 s). Loopback only.

On the parent of the commit that added it: step 1 fails (260 idle
connections filled the scheduler's 256 registering slots and the new
frontend was refused; the metrics endpoint served one connection at a time
with 2 s per read), step 2 fails (no body timeout), step 3 fails (tonic held
idle connections) and step 4 fails (unload answered 200).

Usage: bounds.py SYMPHONY_BINARY
"""
import os
import re
import resource
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402
from cluster import (  # noqa: E402
    ROLE_BACKEND, Cluster, challenged, fail, frame, infer_within, join_answer, listening_ports, metric, recv_frame,
    use_label)

KIND_MODELS, KIND_WELCOME = 10, 13
EVICTIONS_BEFORE_ANSWER = 100

IDLE_PER_PORT = 1000


def idle_connections(port, n):
    """`n` connections to `port` that send nothing, from 127.0.0.2 when the
    host lets us bind it (another address than the real peers')."""
    conns = []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("127.0.0.2", 0))
        except OSError:
            pass
        s.settimeout(2)
        try:
            s.connect(("127.0.0.1", port))
        except OSError:
            s.close()
            continue
        s.setblocking(False)
        conns.append(s)
    return conns


def closed_by_peer(s):
    """Whether the other side closed `s` (EOF or reset); data is drained."""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def health_time(url):
    start = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            if r.status != 200:
                return None
    except (OSError, urllib.error.URLError):
        return None
    return time.monotonic() - start


def trickled_body_is_cut(http_addr, limit_s):
    """Sends a POST head announcing 1000 bytes, then one byte a second; the
    seconds until the server answered and closed, or None past `limit_s`."""
    host, port = http_addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=2)
    s.sendall(b"POST /v2/models/ResNet50/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
              b"content-length: 1000\r\n\r\n{")
    start = time.monotonic()
    got = b""
    s.settimeout(1)
    while time.monotonic() - start < limit_s:
        try:
            s.sendall(b" ")
        except OSError:
            break
        try:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
        except socket.timeout:
            continue
        except OSError:
            break
    took = time.monotonic() - start
    s.close()
    if took >= limit_s:
        return None, got
    return took, got


def peer_registers_through_a_flood(control, token, sched_metrics):
    """A backend-like member connects to the scheduler from 127.0.0.1 and,
    before answering its challenge, IDLE_PER_PORT idle connections arrive
    from 127.0.0.2; once the scheduler has evicted registering links for
    them (more than its 256 slots), the member answers (Join, Models) and
    must be welcomed: a full set of registering links gives up links of the
    address most of them come from."""
    port = int(control.rsplit(":", 1)[1])
    slow, nonce = challenged(port, "127.0.0.1")
    start = time.monotonic()
    full = 'symphony_peers_refused_total{reason="full"}'
    before = metric(sched_metrics, full) or 0
    flood = []
    try:
        # Connected without waiting for each (the scheduler's backlog would
        # serialise them), so the flood lands within the member's 5 s.
        for _ in range(IDLE_PER_PORT):
            f = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            f.bind(("127.0.0.2", 0))
            f.setblocking(False)
            f.connect_ex(("127.0.0.1", port))
            flood.append(f)
        # Had the oldest registering link gone whatever its address, the
        # first eviction would have taken the member's (it is the oldest).
        # Wait for EVICTIONS_BEFORE_ANSWER of them, or as long as the
        # member's 5 s allow (a loaded host accepts slowly).
        until = start + 4.0
        while (metric(sched_metrics, full) or 0) - before < EVICTIONS_BEFORE_ANSWER and time.monotonic() < until:
            time.sleep(0.05)
        evicted = (metric(sched_metrics, full) or 0) - before
        if evicted < 1:
            fail("the scheduler evicted none of the flood's idle links within 4 s")
        body = struct.pack("<III", 1, 0, 0)  # ModelsHead{count 1, busy 0}, model 0
        try:
            slow.sendall(join_answer(nonce, token, ROLE_BACKEND, 4243)
                         + frame(cluster.VERSION, KIND_MODELS, len(body), body))
        except OSError as e:
            fail(f"the scheduler closed a member's registering link from 127.0.0.1 during a flood from "
                 f"127.0.0.2 ({e}), {time.monotonic() - start:.1f} s after it connected")
        reply = recv_frame(slow)
        if reply is None or reply[0] != KIND_WELCOME:
            fail(f"a member registering from 127.0.0.1 was not welcomed while {IDLE_PER_PORT} idle links "
                 f"from 127.0.0.2 were evicted: {reply!r}")
    finally:
        slow.close()
        for f in flood:
            f.close()
    print(f"security bounds: a member registering from 127.0.0.1 was welcomed after {evicted:.0f} of "
          f"{IDLE_PER_PORT} idle connections from 127.0.0.2 were evicted", flush=True)


def main():
    use_label("security bounds")
    if len(sys.argv) != 2:
        fail("usage: bounds.py SYMPHONY_BINARY")
    binary = sys.argv[1]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 16 * IDLE_PER_PORT
    if hard != resource.RLIM_INFINITY and hard < want:
        fail(f"the open-file limit {hard} is below the {want} this attack needs")
    # The daemons inherit it from `up`: they must be able to accept too.
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    extra = None
    with Cluster(binary, prefix="symphony-security-bounds-") as c:
        try:
            extra = run(c)
        finally:
            if extra is not None and extra.poll() is None:
                extra.send_signal(signal.SIGINT)
                try:
                    extra.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    extra.kill()
                    extra.wait()


def run(c):
    binary, tmp, text = c.binary, c.tmp, c.text
    url = c.url()
    grpc_addr = c.printed(r"^frontend 1 grpc: (?:http://)?(\S+)$")
    metrics_urls = re.findall(r"metrics: (http://\S+)/metrics$", text, re.M)
    sched_metrics = c.printed(r"^scheduler metrics: (http://\S+)$")
    control = c.printed(r"^scheduler control: (\S+)$")
    token = c.printed(r"^join token: (\S+)$")
    daemons = c.daemons
    infer_within(url, 30)
    ports = sorted({p for pid in daemons for p in listening_ports(pid)})
    grpc_port = int(grpc_addr.rsplit(":", 1)[1])

    # 0. A flood from another address does not evict a peer registering.
    peer_registers_through_a_flood(control, c.token(), sched_metrics)

    # 1. Idle connections on every port.
    flood = {p: idle_connections(p, IDLE_PER_PORT) for p in ports}
    flooded_at = time.monotonic()
    print("security bounds: %s idle connections held on ports %s" % (
        sum(len(c) for c in flood.values()), ports), flush=True)
    for m in metrics_urls:
        health = m + "/health"
        took = health_time(health)
        if took is None or took >= 1.0:
            fail(f"{health} took {took} s (None: no answer) with idle connections held")
    joined = subprocess.Popen(
        [binary, "daemon", "frontend", "--id", "2", "--scheduler", control, "--join-token-file", token,
         "--transport", "tcp", "--models", "ResNet50", "--metrics", "127.0.0.1:0", "--exit-with-parent"],
        stdout=open(os.path.join(tmp, "f2.out"), "w"), stderr=open(os.path.join(tmp, "f2.err"), "w"))
    until = time.monotonic() + 15
    frontends = None
    while time.monotonic() < until:
        frontends = metric(sched_metrics, "symphony_frontends")
        if frontends == 2 or joined.poll() is not None:
            break
        time.sleep(0.1)
    if frontends != 2:
        fail("a frontend with the token did not register while idle connections were held "
             f"(scheduler counts {frontends} frontends; it exited {joined.poll()}):\n"
             + open(os.path.join(tmp, "f2.err")).read()[-2000:])
    infer_within(url, 10)
    print("security bounds: with the flood held, /health answered within 1 s on %d endpoints, "
          "a frontend with the token registered, inference served" % len(metrics_urls), flush=True)

    # 2. A trickled body is cut by the body timeout.
    took, got = trickled_body_is_cut(url, 13)
    if took is None:
        fail("a trickled HTTP body held its connection for 13 s")
    if b" 408 " not in got.split(b"\r\n", 1)[0]:
        fail(f"a trickled body was closed after {took:.1f} s without a 408: {got[:200]!r}")
    print(f"security bounds: trickled body answered 408 and closed after {took:.1f} s", flush=True)

    # 3. The idle gRPC connections were closed (preface timeout).
    until = flooded_at + 13
    open_grpc = flood.get(grpc_port, [])
    while time.monotonic() < until and open_grpc:
        open_grpc = [s for s in open_grpc if not closed_by_peer(s)]
        time.sleep(0.2)
    if open_grpc:
        fail(f"{len(open_grpc)} idle gRPC connections still open 13 s after they were made")
    print("security bounds: every idle gRPC connection was closed by the frontend", flush=True)
    for conns in flood.values():
        for s in conns:
            s.close()

    # 4. Model control without the admin credential.
    req = urllib.request.Request(f"http://{url}/v2/repository/models/ResNet50/unload", data=b"", method="POST")
    try:
        urllib.request.urlopen(req, timeout=5)
        fail("an unload without the admin credential was answered 200")
    except urllib.error.HTTPError as e:
        if e.code not in (401, 403):
            fail(f"an unload without the admin credential was answered {e.code}")
    with urllib.request.urlopen(f"http://{url}/v2/models/ResNet50/ready", timeout=5) as r:
        if r.status != 200:
            fail("the model is not ready after a refused unload")
    infer_within(url, 10)
    print("security bounds: unload without the admin credential refused; the model still serves", flush=True)

    c.check_alive()
    print("security bounds: ok", flush=True)
    return joined


if __name__ == "__main__":
    main()
