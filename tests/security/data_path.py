#!/usr/bin/env python3
"""The frontend's data port against a member of the cluster (issue 55, the
data-path items).

Starts `symphony up --serve --transport tcp` (a scheduler, a frontend and a
backend as processes) and serves one inference whose input is a marker, so
staging memory has held a client's bytes. Then, as an attacker on the same
host holding the cluster's join token (a member: it answers the data
link's challenge like a backend), it
  1. guesses region keys: READs of the first bytes under the keys the old
     scheme issued first (`generation << 16 | index`, generations 1..64,
     index 0..3; the staging region's was 0x10000). Every READ must be
     refused (no ReadResponse with status Ok) and the frontend must count
     the refusals (`symphony_frontend_refused_memory_keys`, or
     `symphony_frontend_refused_reads` where the READ's missing capability
     refuses it first);
  2. sends an unsigned Register on a fresh data link: refused and counted
     (`symphony_frontend_data_links_refused`);
  3. opens a data link from 127.0.0.1 and, before answering its challenge,
     300 idle connections from 127.0.0.2 (a loopback alias: another source
     address); once the frontend has evicted idle links for them, the
     member answers and its link registers (its READ is answered): a full
     data port evicts links of the address most of them come from;
  4. holds 300 idle connections to the data port (more than the frontend
     lets handshake at once): the oldest are evicted and counted, and a
     member's new data link still registers (its READ is answered).
Every daemon must be alive and the frontend still serve an inference at the
end. Exit 0 when all hold; 1 with the reason otherwise. Loopback only;
bounded in time (about 30 s).

On the parent of the commit that added it: step 1 fails (key 0x10000 named
the staging region: the READ was served), step 2 fails (no such metric),
step 4 fails (no bound: idle links were neither evicted nor counted). On
the session-start main c5f2d45 step 3 fails (the oldest handshaking link
was evicted whatever its address: the member's link closed).

Usage: data_path.py SYMPHONY_BINARY
"""
import hashlib
import hmac
import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import (  # noqa: E402
    DATA_LINK_LABEL, KIND_READ_RESPONSE, READ_STATUS_OK, ROLE_BACKEND, Cluster, challenged, data_port, fail, infer,
    infer_within, join_answer, member_link, metric, read_request, recv_exact, recv_frame, register_backend, use_label)

IDLE = 300


def read_statuses(s, keys, length=64):
    """READs of `length` bytes at offset 0 under each key; their statuses."""
    try:
        s.sendall(b"".join(read_request(k, 0, length) for k in keys))
    except OSError as e:
        fail(f"the data link was closed before its READs were sent ({e})")
    out = []
    for _ in keys:
        f = recv_frame(s)
        if f is None:
            fail(f"the data link closed after {len(out)} of {len(keys)} READ answers")
        kind, body = f
        if kind != KIND_READ_RESPONSE:
            fail(f"expected a ReadResponse, got kind {kind}")
        _wr_id, status, n = struct.unpack("<QII", body[:16])
        if status == READ_STATUS_OK and recv_exact(s, n) is None:
            fail("a served READ's payload was cut")
        out.append(status)
    return out


def refusals(metrics):
    """READs the frontend refused: for a key naming no registration, or (on
    tcp with a join token, checked first) for want of the plan's capability."""
    return sum(metric(metrics, m) or 0.0 for m in (
        "symphony_frontend_refused_memory_keys_total", "symphony_frontend_refused_reads_total"))


def main():
    if len(sys.argv) != 2:
        fail("usage: data_path.py SYMPHONY_BINARY")
    use_label("security data path")
    with Cluster(sys.argv[1], prefix="symphony-security-data-") as c:
        run(c)


def run(c):
    url = c.url()
    metrics = c.printed(r"^frontend 1 metrics: (http://\S+)$")
    token = c.token()
    infer_within(url, 30)
    infer(url, fill=7)  # the bytes the attack must not see
    frontends = c.role_pids("frontend")
    port = data_port(frontends[0]) if len(frontends) == 1 else None
    if port is None:
        fail(f"no frontend under up greets with a challenge (pids {c.daemons}, frontends {frontends})")

    # 1. Guessed keys, from a member's registered link.
    keys = [g << 16 | i for g in range(1, 65) for i in range(4)]
    refused_before = refusals(metrics)
    with member_link(port, token, 4242) as s:
        statuses = read_statuses(s, keys)
    served = [hex(k) for k, st in zip(keys, statuses) if st == READ_STATUS_OK]
    if served:
        fail(f"READs under guessed keys were served: {served[:8]}")
    refused = refusals(metrics)
    if refused - refused_before < len(keys):
        fail(f"{len(keys)} guessed keys refused, but the frontend counts {refused} (before: {refused_before})")
    print(f"security data path: {len(keys)} guessed region keys refused and counted", flush=True)

    # 2. An unsigned Register is refused and counted.
    before = metric(metrics, "symphony_frontend_data_links_refused_total")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(register_backend(4243))
        s.settimeout(5)
        while recv_frame(s) is not None:  # the challenge, then the close
            pass
    after = metric(metrics, "symphony_frontend_data_links_refused_total")
    if before is None or after is None or after < before + 1:
        fail(f"an unsigned Register was not counted as a refused data link ({before} -> {after})")
    print("security data path: an unsigned Register refused and counted", flush=True)

    # 3. A flood from another address does not evict a member handshaking.
    slow, nonce = challenged(port, "127.0.0.1")
    refused_at = metric(metrics, "symphony_frontend_data_links_refused_total") or 0
    flood = []
    for _ in range(IDLE):
        f = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            f.bind(("127.0.0.2", 0))
            f.connect(("127.0.0.1", port))
        except OSError as e:
            fail(f"opening idle connection {len(flood)} from 127.0.0.2 failed: {e}")
        flood.append(f)
    # Bounded by the handshake timeout (5 s) the member must answer within.
    until = time.monotonic() + 3
    while (metric(metrics, "symphony_frontend_data_links_refused_total") or 0) - refused_at < IDLE - 64:
        if time.monotonic() > until:
            fail("the frontend evicted too few of the flood's idle links within 3 s")
        time.sleep(0.05)
    slow.sendall(join_answer(nonce, hmac.new(token, DATA_LINK_LABEL, hashlib.sha256).digest(), ROLE_BACKEND, 4245))
    try:
        read_statuses(slow, [0x1234_0000])
    finally:
        slow.close()
        for f in flood:
            f.close()
    print(f"security data path: a member handshaking from 127.0.0.1 registered while {IDLE} idle links "
          "from 127.0.0.2 were evicted", flush=True)

    # 4. Idle links past the bound are evicted; a member still registers.
    idle = []
    for _ in range(IDLE):
        try:
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        except OSError as e:
            fail(f"opening idle connection {len(idle)} failed: {e}")
    with member_link(port, token, 4244) as s:
        if read_statuses(s, [0x1234_0000]) == [READ_STATUS_OK]:
            fail("a READ under an arbitrary key was served")
    evicted = (metric(metrics, "symphony_frontend_data_links_refused_total") or 0) - after
    for conn in idle:
        conn.close()
    if evicted < IDLE - 64:
        fail(f"{IDLE} idle data links held, only {evicted} evicted (the bound is 64 handshaking)")
    print(f"security data path: {IDLE} idle data links: {evicted:.0f} evicted and counted, a member still registered",
          flush=True)

    infer_within(url, 10)
    c.check_alive()
    print("security data path: ok", flush=True)


if __name__ == "__main__":
    main()
