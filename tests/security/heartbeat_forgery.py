#!/usr/bin/env python3
"""Forged election heartbeats against real hot-standby schedulers (issue 55
item 5).

Starts a one-member etcd (/usr/bin/etcd or $ETCD) and two scheduler daemons
with --etcd and a join token, all on loopback, waits until one leads, then,
as an attacker who can reach the heartbeat UDP ports but has no token:
  1. sends the leader 400 forged pongs over 2 s claiming a huge term, in the
     old 16-byte format (magic SYHB, which made a leader step down) and in
     the current one (magic SYH2, random nonce and MAC): the leader must
     keep its term (no step-down, no new term counted) and count the
     forged ones (symphony_scheduler_heartbeats_refused_total > 0);
  2. keeps sending the standby forged pongs of the leader's term in both
     formats (which kept a standby from taking over) and kills the leader
     (SIGKILL): the standby must lead within 5 s.
Exit 0 when both hold; 1 with the reason otherwise. Bounded in time (about
20 s). Loopback only.

On the parent of the commit that added it: step 1 fails (the leader stepped
down at the first forged pong) and step 2 fails (the forged pongs refreshed
the standby's view of the dead leader, so it never took over).

Usage: heartbeat_forgery.py SYMPHONY_BINARY
"""
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

BOUND_S = 30


def fail(why):
    print("security heartbeats: FAIL: " + why, flush=True)
    sys.exit(1)


def free_port(rng, udp=False):
    """A loopback port below the ephemeral range that nothing uses now (the
    daemons are started on fixed addresses; see dataplane's unused_port)."""
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM if udp else socket.SOCK_STREAM)
        try:
            s.bind(("127.0.0.1", port))
            return port
        except OSError:
            continue
        finally:
            s.close()
    fail("no free loopback port")


def metrics_text(addr):
    return urllib.request.urlopen(f"http://{addr}/metrics", timeout=2).read().decode()


def metric(text, name):
    m = re.search(r"^%s (\S+)$" % re.escape(name), text, re.M)
    return float(m.group(1)) if m else None


def standing(addr):
    """(epoch led, terms begun, heartbeats refused) of the scheduler whose
    metrics are at `addr`; None if it does not answer."""
    try:
        t = metrics_text(addr)
    except OSError:
        return None
    return (metric(t, "symphony_scheduler_leader_epoch") or 0,
            metric(t, "symphony_scheduler_terms_total") or 0,
            metric(t, "symphony_scheduler_heartbeats_refused_total") or 0)


def forged_pongs(rng, epoch):
    old = struct.pack("<4sIQ", b"SYHB", 2, epoch)
    new = struct.pack("<4sIQ", b"SYH2", 2, epoch) + rng.randbytes(16) + rng.randbytes(16)
    return [old, new]


def main():
    if len(sys.argv) != 2:
        fail("usage: heartbeat_forgery.py SYMPHONY_BINARY")
    binary = sys.argv[1]
    etcd = os.environ.get("ETCD") or shutil.which("etcd")
    if not etcd:
        fail("no etcd binary (install Debian's etcd-server or set ETCD)")
    rng = random.Random(55)
    tmp = tempfile.mkdtemp(prefix="symphony-security-hb-")
    procs = []
    try:
        run(binary, etcd, rng, tmp, procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def run(binary, etcd, rng, tmp, procs):
    client, peer = free_port(rng), free_port(rng)
    procs.append(subprocess.Popen(
        [etcd, "--name", "m0", "--data-dir", os.path.join(tmp, "etcd"),
         "--listen-client-urls", f"http://127.0.0.1:{client}", "--advertise-client-urls", f"http://127.0.0.1:{client}",
         "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-cluster", f"m0=http://127.0.0.1:{peer}"],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "etcd.err"), "w")))
    token = os.path.join(tmp, "token")
    with open(token, "w") as f:
        f.write("%032x\n" % rng.getrandbits(128))
    os.chmod(token, 0o600)
    scheds = []
    for i in range(2):
        hb, metrics, listen = free_port(rng, udp=True), free_port(rng), free_port(rng)
        p = subprocess.Popen(
            [binary, "daemon", "scheduler", "--listen", f"127.0.0.1:{listen}", "--transport", "tcp",
             "--models", "ResNet50", "--etcd", f"http://127.0.0.1:{client}",
             "--election-listen", f"127.0.0.1:{hb}", "--metrics", f"127.0.0.1:{metrics}",
             "--join-token-file", token],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, f"s{i}.err"), "w"))
        procs.append(p)
        scheds.append({"proc": p, "hb": hb, "metrics": f"127.0.0.1:{metrics}", "err": os.path.join(tmp, f"s{i}.err")})

    deadline = time.monotonic() + BOUND_S
    leader = standby = None
    while time.monotonic() < deadline:
        states = [standing(s["metrics"]) for s in scheds]
        if all(states) and sum(1 for st in states if st[0] > 0) == 1:
            i = 0 if states[0][0] > 0 else 1
            leader, standby = scheds[i], scheds[1 - i]
            break
        for s in scheds:
            if s["proc"].poll() is not None:
                fail("a scheduler exited early:\n" + open(s["err"]).read()[-3000:])
        time.sleep(0.1)
    if leader is None:
        fail("no scheduler was elected within %d s" % BOUND_S)
    # The standby has followed for a while (its pings flow).
    time.sleep(0.5)
    epoch, terms, _ = standing(leader["metrics"])
    print(f"security heartbeats: leader at heartbeat port {leader['hb']} leads term {epoch:.0f}", flush=True)

    # 1. Forged pongs with a huge term to the leader.
    attacker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for _ in range(200):
        for d in forged_pongs(rng, 1 << 62):
            attacker.sendto(d, ("127.0.0.1", leader["hb"]))
        time.sleep(0.01)
    time.sleep(0.3)
    after = standing(leader["metrics"])
    if after is None or after[0] != epoch or after[1] != terms:
        fail(f"forged pongs moved the leader: term {epoch} -> {after and after[0]}, terms begun {terms} -> {after and after[1]}")
    if after[2] <= 0:
        fail("the leader did not count the forged heartbeats")
    print(f"security heartbeats: 400 forged pongs: the leader kept term {epoch:.0f}, "
          f"{after[2]:.0f} heartbeats refused", flush=True)

    # 2. Forged pongs of the leader's term to the standby while the leader dies.
    leader["proc"].send_signal(signal.SIGKILL)
    leader["proc"].wait()
    killed = time.monotonic()
    took = None
    while time.monotonic() - killed < 5:
        for d in forged_pongs(rng, int(epoch)):
            attacker.sendto(d, ("127.0.0.1", standby["hb"]))
        st = standing(standby["metrics"])
        if st and st[0] > epoch:
            took = time.monotonic() - killed
            break
        time.sleep(0.005)
    if took is None:
        fail("forged pongs kept the standby from taking over within 5 s of the leader's death")
    refused = standing(standby["metrics"])[2]
    print(f"security heartbeats: the standby took over {took:.2f} s after the leader was killed "
          f"despite forged pongs ({refused:.0f} refused)", flush=True)
    print("security heartbeats: ok", flush=True)


if __name__ == "__main__":
    main()
