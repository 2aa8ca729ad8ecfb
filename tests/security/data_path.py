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
     the refusals (`symphony_frontend_refused_memory_keys`);
  2. sends an unsigned Register on a fresh data link: refused and counted
     (`symphony_frontend_data_links_refused`);
  3. holds 300 idle connections to the data port (more than the frontend
     lets handshake at once): the oldest are evicted and counted, and a
     member's new data link still registers (its READ is answered).
Every daemon must be alive and the frontend still serve an inference at the
end. Exit 0 when all hold; 1 with the reason otherwise. Loopback only;
bounded in time (about 30 s).

On the parent of the commit that added it: step 1 fails (key 0x10000 named
the staging region: the READ was served), step 2 fails (no such metric),
step 3 fails (no bound: idle links were neither evicted nor counted).

Usage: data_path.py SYMPHONY_BINARY
"""
import hashlib
import hmac
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attack_ports import (  # noqa: E402
    HEADER, KIND_READ_RESPONSE, MAGIC, VERSION, alive, children, fail, frame, infer_within,
    listening_ports, read_request, register_backend)

KIND_CHALLENGE, KIND_JOIN = 11, 12
ROLE_BACKEND, JOIN_HAS_MAC = 2, 1
MAC_DOMAIN = b"symphony-join\0"           # dataplane::join::MAC_DOMAIN
DATA_LINK_LABEL = b"symphony-data-link"   # dataplane::join::DATA_LINK_LABEL
ENDPOINT_LEN = 64
READ_STATUS_OK = 0
IDLE = 300
BOUND_S = 60


def metric(url, name):
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    m = re.search(r"^%s (\S+)$" % re.escape(name), text, re.M)
    return float(m.group(1)) if m else None


def recv_frame(s):
    """One wire frame from `s` (header, body), or None if it closed first."""
    head = recv_exact(s, HEADER.size)
    if head is None:
        return None
    magic, _version, kind, length, _ = HEADER.unpack(head)
    if magic != MAGIC or length > 1 << 20:
        fail(f"not a wire frame: {head!r}")
    body = recv_exact(s, length)
    return None if body is None else (kind, body)


def recv_exact(s, n):
    got = b""
    while len(got) < n:
        try:
            chunk = s.recv(n - len(got))
        except OSError:
            return None
        if not chunk:
            return None
        got += chunk
    return got


def member_link(port, token, backend_id):
    """A data link that answers the frontend's challenge with the token, as
    a backend does (`JoinToken::for_purpose(DATA_LINK_LABEL).sign`)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    first = recv_frame(s)
    if first is None or first[0] != KIND_CHALLENGE:
        fail(f"port {port} sent no challenge: {first!r}")
    nonce = first[1][:32]
    data_key = hmac.new(token, DATA_LINK_LABEL, hashlib.sha256).digest()
    signed = struct.pack("<IIII", ROLE_BACKEND, backend_id, 1, JOIN_HAS_MAC) + b"\0" * ENDPOINT_LEN
    mac = hmac.new(data_key, MAC_DOMAIN + nonce + struct.pack("<H", VERSION) + signed, hashlib.sha256).digest()
    body = signed + mac
    s.sendall(frame(VERSION, KIND_JOIN, len(body), body))
    return s


def read_statuses(s, keys, length=64):
    """READs of `length` bytes at offset 0 under each key; their statuses."""
    s.sendall(b"".join(read_request(k, 0, length) for k in keys))
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


def data_port(pid):
    """The frontend's data port: the one of its ports that greets a fresh
    connection with a Challenge."""
    for port in listening_ports(pid):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                s.settimeout(1)
                f = recv_frame(s)
                if f is not None and f[0] == KIND_CHALLENGE:
                    return port
        except OSError:
            continue
    return None


def infer_marker(url):
    """One inference whose input is all 7s (the bytes the attack must not see)."""
    meta = json.load(urllib.request.urlopen(f"http://{url}/v2/models/ResNet50", timeout=10))
    inp = meta["inputs"][0]
    shape = [1 if d < 0 else d for d in inp["shape"]]
    n = 1
    for d in shape:
        n *= d
    body = {"inputs": [{"name": inp["name"], "datatype": inp["datatype"], "shape": shape, "data": [7] * n}]}
    req = urllib.request.Request(f"http://{url}/v2/models/ResNet50/infer", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    json.load(urllib.request.urlopen(req, timeout=10))


def main():
    if len(sys.argv) != 2:
        fail("usage: data_path.py SYMPHONY_BINARY")
    tmp = tempfile.mkdtemp(prefix="symphony-security-data-")
    out_path, err_path = os.path.join(tmp, "out"), os.path.join(tmp, "err")
    args = [sys.argv[1], "up", "--serve", "--transport", "tcp", "--models", "ResNet50",
            "--frontends", "1", "--backends", "1"]
    with open(out_path, "w") as out, open(err_path, "w") as err:
        up = subprocess.Popen(args, stdout=out, stderr=err, start_new_session=True)
    try:
        run(up, out_path, err_path)
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)
            try:
                up.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(up.pid, signal.SIGKILL)
                up.wait()


def run(up, out_path, err_path):
    deadline = time.monotonic() + BOUND_S
    text = ""
    while time.monotonic() < deadline:
        text = open(out_path).read()
        if "serving;" in text:
            break
        if up.poll() is not None:
            fail("symphony up exited early:\n" + open(err_path).read()[-3000:])
        time.sleep(0.1)
    else:
        fail("symphony up did not start within %d s" % BOUND_S)

    def printed(pattern):
        m = re.search(pattern, text, re.M)
        if not m:
            fail(f"up printed no line matching {pattern!r}:\n{text}")
        return m.group(1)

    url = printed(r"^frontend 1: http://(\S+)$")
    metrics = printed(r"^frontend 1 metrics: (http://\S+)$")
    token = open(printed(r"^join token: (\S+)$"), "rb").read().strip()
    daemons = children(up.pid)
    infer_within(url, 30)
    infer_marker(url)
    frontends = [pid for pid in daemons if b"frontend" in open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")]
    port = data_port(frontends[0]) if len(frontends) == 1 else None
    if port is None:
        fail(f"no frontend under up greets with a challenge (pids {daemons}, frontends {frontends})")

    # 1. Guessed keys, from a member's registered link.
    keys = [g << 16 | i for g in range(1, 65) for i in range(4)]
    refused_before = metric(metrics, "symphony_frontend_refused_memory_keys_total") or 0.0
    with member_link(port, token, 4242) as s:
        statuses = read_statuses(s, keys)
    served = [hex(k) for k, st in zip(keys, statuses) if st == READ_STATUS_OK]
    if served:
        fail(f"READs under guessed keys were served: {served[:8]}")
    refused = metric(metrics, "symphony_frontend_refused_memory_keys_total")
    if refused is None or refused - refused_before < len(keys):
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

    # 3. Idle links past the bound are evicted; a member still registers.
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
    for c in idle:
        c.close()
    if evicted < IDLE - 64:
        fail(f"{IDLE} idle data links held, only {evicted} evicted (the bound is 64 handshaking)")
    print(f"security data path: {IDLE} idle data links: {evicted:.0f} evicted and counted, a member still registered",
          flush=True)

    infer_within(url, 10)
    dead = [pid for pid in daemons if not alive(pid)]
    if up.poll() is not None or dead:
        fail(f"daemons died: {dead} (up exit status {up.poll()}); stderr tail:\n" + open(err_path).read()[-3000:])
    print("security data path: ok", flush=True)


if __name__ == "__main__":
    main()
