#!/usr/bin/env python3
"""Malformed bytes against every TCP port of the real daemons (issue 55 item 1).

Starts `symphony up --serve --transport tcp` (a scheduler, a frontend and a
backend as processes), finds every TCP port each daemon listens on (from
/proc, not from what `up` prints, so a port nobody documented is attacked
too), and sends each one, on fresh connections with no token, the frames of
the issue: the 16-byte header `SYMP`, another wire version, kind
ReadRequest, length 0 (which panicked the scheduler and killed a
frontend's I/O thread), and its neighbours (foreign versions with bodies,
huge and truncated lengths, a READ request for the first staging key,
unsolicited READ responses, a seeded random blob). Then:
  - every daemon and `up` itself is still running;
  - no attacker connection got a READ response (no staging memory served
    to a peer that never registered, nor to one that claimed a backend's id
    with an unsigned Register or a forged Join: data links must answer the
    frontend's challenge with the join token);
  - every port still listens, and frontend 1 serves a KServe v2 inference
    end to end (client -> frontend -> scheduler -> backend -> client).
Exit 0 when all hold; 1 with the reason otherwise. Bounded in time.

Usage: attack_ports.py SYMPHONY_BINARY
"""
import os
import random
import re
import socket
import struct
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402
from cluster import (  # noqa: E402
    BOUND_S, HEADER, KIND_HEARTBEAT, KIND_READ_REQUEST, KIND_READ_RESPONSE, MAGIC, Cluster, fail, forged_join,
    frame, infer_within, listening_ports, metric, read_request, register_backend)


def attack_frames():
    """The frames of the issue and their neighbours, for the wire version the
    cluster speaks (`cluster.VERSION`, read off the wire once it started)."""
    version = cluster.VERSION
    rng = random.Random(55)
    return [
        ("the issue's 16 bytes (another version, ReadRequest, length 0)", frame(version + 1, KIND_READ_REQUEST, 0)),
        ("older version, ReadRequest, 4-byte body", frame(version - 1, KIND_READ_REQUEST, 4, b"\0" * 4)),
        ("foreign version, whole ReadRequest", read_request(0x10000, 0, 64, version=version + 1)),
        ("READ request before registering (first staging key)", read_request(0x10000, 0, 64)),
        ("READ request, truncated length", frame(version, KIND_READ_REQUEST, 8, b"\0" * 8)),
        ("huge length", frame(version, KIND_HEARTBEAT, 0xFFFFFFFF)),
        ("foreign version, huge length", frame(version + 1, KIND_HEARTBEAT, 0xFFFFFFF0)),
        ("foreign version, ReadResponse", frame(version + 1, KIND_READ_RESPONSE, 0)),
        ("unsolicited ReadResponse", frame(version, KIND_READ_RESPONSE, 16, struct.pack("<QII", 1, 0, 0))),
        ("seeded random bytes", bytes(rng.getrandbits(8) for _ in range(512))),
        # Data-link forgery (issue 55 item 2): claim the backend's id, then READ.
        ("unsigned Register{Backend} then a READ", register_backend(1) + read_request(0x10000, 0, 64)),
        ("forged Join{Backend} then a READ",
         forged_join(1, bytes(rng.getrandbits(8) for _ in range(32))) + read_request(0x10000, 0, 64)),
    ]


def replies_read_response(data):
    """Whether `data` holds a wire frame of kind ReadResponse (walks the frames)."""
    i = 0
    while i + HEADER.size <= len(data):
        magic, _version, kind, length, _ = HEADER.unpack_from(data, i)
        if magic != MAGIC:
            return False
        if kind == KIND_READ_RESPONSE:
            return True
        i += HEADER.size + length
    return False


def send_one(port, payload):
    """Sends `payload` on a fresh connection; returns what came back before
    the daemon closed or 1 s of silence (a bound, not a synchronisation: the
    checks below poll the daemons themselves)."""
    got = b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(payload)
            s.settimeout(1)
            while len(got) < 1 << 20:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
    except OSError:
        pass
    return got


def main():
    if len(sys.argv) != 2:
        fail("usage: attack_ports.py SYMPHONY_BINARY")
    with Cluster(sys.argv[1]) as c:
        run(c)


def run(c):
    url = c.url()
    daemons = c.daemons
    # Before the attack: the cluster serves.
    infer_within(url, 30)
    ports = {pid: listening_ports(pid) for pid in daemons}
    targets = [(pid, port) for pid, ps in ports.items() for port in ps]
    if not targets:
        fail("no listening port found")
    print("security: wire version %d; attacking %d ports of %d daemons: %s" % (
        cluster.VERSION, len(targets), len(daemons), ports), flush=True)

    # Every daemon counts the links it closed for bad bytes on its /metrics.
    metrics_urls = [m + "/metrics" for m in re.findall(r"metrics: (http://\S+)/metrics$", c.text, re.M)]
    if not metrics_urls:
        fail("no daemon metrics address printed")
    closed_before = links_closed(metrics_urls)

    frames = attack_frames()
    served = []
    lock = threading.Lock()

    def attack(pid, port):
        for what, payload in frames:
            got = send_one(port, payload)
            if replies_read_response(got):
                with lock:
                    served.append(f"pid {pid} port {port}: answered a READ to '{what}'")

    threads = [threading.Thread(target=attack, args=t) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=BOUND_S)

    c.check_alive()
    if served:
        fail("staging memory served before registration:\n  " + "\n  ".join(served))
    for pid, ps in ports.items():
        still = listening_ports(pid)
        missing = [p for p in ps if p not in still]
        if missing:
            fail(f"pid {pid} no longer listens on {missing}")
    infer_within(url, 30)
    closed = links_closed(metrics_urls) - closed_before
    if closed < 1:
        fail("no daemon's symphony_links_closed_total{reason=\"bad_bytes\"} moved after the attack")
    print("security: %d malformed frames x %d ports: every daemon alive, no READ served, "
          "inference still served; %d links closed for bad bytes (metrics)" % (len(frames), len(targets), closed),
          flush=True)


def links_closed(metrics_urls):
    """Links the daemons closed for bad bytes, summed over their /metrics."""
    return sum(metric(m, 'symphony_links_closed_total{reason="bad_bytes"}') or 0 for m in metrics_urls)


if __name__ == "__main__":
    main()
