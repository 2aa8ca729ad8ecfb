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
import json
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

MAGIC = b"SYMP"
VERSION = 7  # dataplane::wire::VERSION (a test below reads it off the wire when it can)
KIND_REGISTER, KIND_HEARTBEAT, KIND_READ_REQUEST, KIND_READ_RESPONSE, KIND_JOIN = 1, 2, 8, 9, 12
ROLE_BACKEND, JOIN_HAS_MAC = 2, 1
HEADER = struct.Struct("<4sHHII")  # magic, version, kind, len, reserved
BOUND_S = 60


def fail(why):
    print("security: FAIL: " + why, flush=True)
    sys.exit(1)


def frame(version, kind, length, body=b""):
    return HEADER.pack(MAGIC, version, kind, length, 0) + body


def read_request(key, offset, length, version=VERSION):
    body = struct.pack("<QIIQ", 1, key, length, offset)  # wr_id, RemoteRef{key, len, offset}
    return frame(version, KIND_READ_REQUEST, len(body), body)


def register_backend(backend_id):
    """An unsigned Register{Backend}: role, id, count, reserved, 64-byte endpoint."""
    body = struct.pack("<IIII", ROLE_BACKEND, backend_id, 1, 0) + b"\0" * 64
    return frame(VERSION, KIND_REGISTER, len(body), body)


def forged_join(backend_id, mac):
    """A Join{Backend} claiming a MAC it cannot have made (no token)."""
    body = struct.pack("<IIII", ROLE_BACKEND, backend_id, 1, JOIN_HAS_MAC) + b"\0" * 64 + mac
    return frame(VERSION, KIND_JOIN, len(body), body)


def attack_frames():
    rng = random.Random(55)
    return [
        ("the issue's 16 bytes (version 8, ReadRequest, length 0)", frame(8, KIND_READ_REQUEST, 0)),
        ("older version, ReadRequest, 4-byte body", frame(VERSION - 1, KIND_READ_REQUEST, 4, b"\0" * 4)),
        ("foreign version, whole ReadRequest", read_request(0x10000, 0, 64, version=VERSION + 1)),
        ("READ request before registering (first staging key)", read_request(0x10000, 0, 64)),
        ("READ request, truncated length", frame(VERSION, KIND_READ_REQUEST, 8, b"\0" * 8)),
        ("huge length", frame(VERSION, KIND_HEARTBEAT, 0xFFFFFFFF)),
        ("foreign version, huge length", frame(VERSION + 1, KIND_HEARTBEAT, 0xFFFFFFF0)),
        ("foreign version, ReadResponse", frame(VERSION + 1, KIND_READ_RESPONSE, 0)),
        ("unsolicited ReadResponse", frame(VERSION, KIND_READ_RESPONSE, 16, struct.pack("<QII", 1, 0, 0))),
        ("seeded random bytes", bytes(rng.getrandbits(8) for _ in range(512))),
        # Data-link forgery (issue 55 item 2): claim the backend's id, then READ.
        ("unsigned Register{Backend} then a READ", register_backend(1) + read_request(0x10000, 0, 64)),
        ("forged Join{Backend} then a READ",
         forged_join(1, bytes(rng.getrandbits(8) for _ in range(32))) + read_request(0x10000, 0, 64)),
    ]


def children(pid):
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except OSError:
        return False


def listening_ports(pid):
    """TCP ports `pid` listens on: its socket inodes matched in /proc/net/tcp{,6}."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            m = re.fullmatch(r"socket:\[(\d+)\]", link)
            if m:
                inodes.add(m.group(1))
    except OSError:
        return []
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


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


def infer(url):
    meta = json.load(urllib.request.urlopen(f"http://{url}/v2/models/ResNet50", timeout=10))
    inp = meta["inputs"][0]
    shape = [1 if d < 0 else d for d in inp["shape"]]
    n = 1
    for d in shape:
        n *= d
    body = {"inputs": [{"name": inp["name"], "datatype": inp["datatype"], "shape": shape, "data": [0] * n}]}
    req = urllib.request.Request(
        f"http://{url}/v2/models/ResNet50/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    res = json.load(urllib.request.urlopen(req, timeout=10))
    if not res.get("outputs"):
        raise RuntimeError(f"no outputs: {res}")
    return res


def infer_within(url, seconds):
    deadline = time.monotonic() + seconds
    last = None
    while time.monotonic() < deadline:
        try:
            return infer(url)
        except Exception as e:  # noqa: BLE001 - reported below
            last = e
            time.sleep(0.2)
    fail(f"frontend 1 at {url} serves no inference: {last}")


def main():
    if len(sys.argv) != 2:
        fail("usage: attack_ports.py SYMPHONY_BINARY")
    binary = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="symphony-security-")
    out_path, err_path = os.path.join(tmp, "out"), os.path.join(tmp, "err")
    args = [binary, "up", "--serve", "--transport", "tcp", "--models", "ResNet50",
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
    url = None
    while time.monotonic() < deadline:
        text = open(out_path).read()
        m = re.search(r"^frontend 1: http://([0-9.:]+)$", text, re.M)
        if m and "serving;" in text:
            url = m.group(1)
            break
        if up.poll() is not None:
            fail("symphony up exited early:\n" + open(err_path).read()[-3000:])
        time.sleep(0.1)
    if url is None:
        fail("symphony up did not start within %d s" % BOUND_S)
    daemons = children(up.pid)
    if len(daemons) < 3:
        fail(f"expected a scheduler, a frontend and a backend under up, found pids {daemons}")
    # Before the attack: the cluster serves.
    infer_within(url, 30)
    ports = {pid: listening_ports(pid) for pid in daemons}
    targets = [(pid, port) for pid, ps in ports.items() for port in ps]
    if not targets:
        fail("no listening port found")
    print("security: attacking %d ports of %d daemons: %s" % (len(targets), len(daemons), ports), flush=True)

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

    dead = [pid for pid in daemons if not alive(pid)]
    if up.poll() is not None or dead:
        fail(f"daemons died: {dead} (up exit status {up.poll()}); stderr tail:\n" + open(err_path).read()[-3000:])
    if served:
        fail("staging memory served before registration:\n  " + "\n  ".join(served))
    for pid, ps in ports.items():
        still = listening_ports(pid)
        missing = [p for p in ps if p not in still]
        if missing:
            fail(f"pid {pid} no longer listens on {missing}")
    infer_within(url, 30)
    print("security: %d malformed frames x %d ports: every daemon alive, no READ served, "
          "inference still served" % (len(frames), len(targets)), flush=True)


if __name__ == "__main__":
    main()
