#!/usr/bin/env python3
"""A process on the scheduler's address, without the join token, welcoming
the cluster's peers (issue 55 item 3, mutual authentication).

Starts a scheduler, a frontend and a backend (TCP, one join token, all on
loopback) and checks that an inference is served. Then, as an attacker who
took the scheduler's address but has no token: kills the scheduler and
listens on its address, answering every peer that reconnects with a
Challenge and then a Welcome for epoch 0xFFFFFFFF, unsigned (zero MAC) on
one connection and forged (random MAC) on the next, for FAKE_S seconds.
Each peer must refuse each Welcome (send nothing more on the link; the backend and the
frontend log that it does not prove the join token) and reconnect. Then the
fake goes and the real scheduler is started again on that address: the
backend and the frontend must register with it and an inference must be
served within BOUND_S.

While the fake holds the address, each peer must back off: a link refused
before registering is a failed attempt of its reconnect schedule (10, 20,
then 40 ms apart in the first second, doubling to 1 s after: about 30 in
FAKE_S), so at most MAX_LINKS per peer reach the fake. Each peer's /metrics
must count the Welcomes it refused (symphony_frontend_forged_welcomes_total,
symphony_backend_forged_welcomes_total): at least those the fake saw
refused, at most those it sent.

On the parent of the commit that added it (the daemons of c71946d, which
serve as c5f2d45's: that commit changed a document only), the backend took
the fake's Welcome and its epoch 0xFFFFFFFF, and then refused the real
scheduler ("the scheduler leads epoch 0, but epoch 4294967295 was seen
already") on every reconnection: the inference after the restart fails.
On the daemons of 65c7dbd (before the schedule counted a refused link as a
failed attempt) each peer started its backoff over on every accepted link
and reached the fake about 100 times a second, so the MAX_LINKS check
fails there.

Usage: forged_welcome.py SYMPHONY_BINARY
"""
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402

cluster.use_label("security forged welcome")
fail = cluster.fail

KIND_MODELS, KIND_WELCOME = 10, 13
ROLE_FRONTEND = 1
CHALLENGE_TOKEN_REQUIRED = 1
BOUND_S = 30
FAKE_S = 4.0
# Links per peer the fake may see in FAKE_S: the schedule allows about 30.
MAX_LINKS = 45


def free_port(rng):
    """A loopback port below the ephemeral range that nothing uses now."""
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("127.0.0.1", port))
            return port
        except OSError:
            continue
        finally:
            s.close()
    fail("no free loopback port")


class FakeScheduler:
    """Listens on the scheduler's address; greets every connection with a
    Challenge, reads the peer's Join (and a backend's Models), answers a
    Welcome for epoch 0xFFFFFFFF (unsigned, then forged, alternating) and
    records whether the peer sent nothing more on the link within 0.5 s of
    it (it refused)."""

    def __init__(self, port, version, rng):
        self.version = version
        self.rng = rng
        self.lock = threading.Lock()
        self.welcomed = []  # (role, signed_how, refused)
        self.accepted = 0
        self.joined = {}  # role: Joins read
        self.sent = {}  # role: Welcomes sent whole
        self.unsent = []  # roles whose Welcome could not be sent
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        deadline = time.monotonic() + 5
        while True:
            try:
                self.sock.bind(("127.0.0.1", port))
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    fail(f"cannot listen on the scheduler's address 127.0.0.1:{port}: {e}")
                time.sleep(0.05)
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self):
        n = 0
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._greet, args=(conn, n), daemon=True)
            n += 1
            with self.lock:
                self.accepted = n
            self.threads.append(t)
            t.start()

    def _welcome(self, forged):
        body = struct.pack("<IIQ", 1, 0xFFFFFFFF, 1_000_000)
        if self.version >= 9:  # the Welcome carries the scheduler's MAC since version 9
            body += self.rng.randbytes(32) if forged else b"\0" * 32
        return cluster.frame(self.version, KIND_WELCOME, len(body), body)

    def _greet(self, conn, n):
        with conn:
            conn.settimeout(3)
            nonce = self.rng.randbytes(32)
            challenge = nonce + struct.pack("<HHIQ", self.version, self.version, CHALLENGE_TOKEN_REQUIRED, 0)
            try:
                conn.sendall(cluster.frame(self.version, cluster.KIND_CHALLENGE, len(challenge), challenge))
            except OSError:
                return
            join = cluster.recv_frame(conn)
            if join is None or join[0] != cluster.KIND_JOIN:
                return
            role, _id = struct.unpack("<II", join[1][:8])
            self._count(self.joined, role)
            if role == cluster.ROLE_BACKEND:
                models = cluster.recv_frame(conn)
                if models is None or models[0] != KIND_MODELS:
                    return
            forged = n % 2 == 1
            try:
                conn.sendall(self._welcome(forged))
            except OSError:
                with self.lock:
                    self.unsent.append(role)
                self._record(role, forged, True)
                return
            self._count(self.sent, role)
            # A peer that took it sends on it (heartbeats every 100 ms, or
            # tasks); one that refused it sends nothing more: the frontend
            # closes the link at once, the backend when its next attempt
            # replaces it (its backoff may be longer than this wait).
            conn.settimeout(0.1)
            until = time.monotonic() + 0.5
            refused = True
            while time.monotonic() < until:
                if self.stop.is_set():
                    return  # undecided: the fake is leaving
                try:
                    if conn.recv(65536):
                        refused = False
                    break
                except socket.timeout:
                    continue
                except OSError:
                    break
            self._record(role, forged, refused)

    def _count(self, counts, role):
        with self.lock:
            counts[role] = counts.get(role, 0) + 1

    def _record(self, role, forged, refused):
        with self.lock:
            self.welcomed.append((role, "forged" if forged else "unsigned", refused))

    def close(self):
        self.stop.set()
        self.sock.close()
        for t in self.threads:
            t.join(timeout=5)


def main():
    if len(sys.argv) != 2:
        fail("usage: forged_welcome.py SYMPHONY_BINARY")
    binary = sys.argv[1]
    rng = random.Random(55)
    tmp = tempfile.mkdtemp(prefix="symphony-security-welcome-")
    procs = {}
    try:
        run(binary, rng, tmp, procs)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def log(tmp, name):
    try:
        return open(os.path.join(tmp, name + ".err")).read()
    except OSError:
        return ""


def run(binary, rng, tmp, procs):
    token = os.path.join(tmp, "token")
    with open(token, "w") as f:
        f.write("%032x\n" % rng.getrandbits(128))
    os.chmod(token, 0o600)
    control, http = free_port(rng), free_port(rng)
    metrics = {"frontend": free_port(rng), "backend": free_port(rng)}
    common = ["--transport", "tcp", "--models", "ResNet50", "--join-token-file", token]

    def start(name, role, args):
        procs[name] = subprocess.Popen(
            [binary, "daemon", role] + common + args,
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, name + ".err"), "a"))

    def start_scheduler():
        start("scheduler", "scheduler", ["--listen", f"127.0.0.1:{control}"])

    start_scheduler()
    version = None
    deadline = time.monotonic() + BOUND_S
    while version is None and time.monotonic() < deadline:
        version = cluster.spoken_version(f"127.0.0.1:{control}")
        if procs["scheduler"].poll() is not None:
            fail("the scheduler exited early:\n" + log(tmp, "scheduler")[-3000:])
        time.sleep(0.05)
    if version is None:
        fail(f"the scheduler did not listen on 127.0.0.1:{control} within {BOUND_S} s")
    start("backend", "backend", ["--id", "1", "--scheduler", f"127.0.0.1:{control}", "--gpus-per-backend", "1",
                                 "--metrics", f"127.0.0.1:{metrics['backend']}"])
    start("frontend", "frontend", ["--id", "1", "--scheduler", f"127.0.0.1:{control}", "--http", f"127.0.0.1:{http}",
                                   "--metrics", f"127.0.0.1:{metrics['frontend']}"])
    url = f"127.0.0.1:{http}"
    cluster.infer_within(url, BOUND_S)
    print(f"security forged welcome: a cluster of wire version {version} serves at {url}", flush=True)

    # The attacker takes the scheduler's address.
    procs["scheduler"].send_signal(signal.SIGKILL)
    procs["scheduler"].wait()
    fake = FakeScheduler(control, version, rng)
    time.sleep(FAKE_S)
    fake.close()
    for name in ("backend", "frontend"):
        if procs[name].poll() is not None:
            fail(f"the {name} exited while the fake held the address:\n" + log(tmp, name)[-3000:])
    seen = list(fake.welcomed)
    counts = {}
    for role, how, refused in seen:
        key = ("backend" if role == cluster.ROLE_BACKEND else "frontend", how, "refused" if refused else "kept")
        counts[key] = counts.get(key, 0) + 1
    print(f"security forged welcome: the fake accepted {fake.accepted} links in {FAKE_S:.0f} s and welcomed {len(seen)}: "
          + ", ".join(f"{n} {' '.join(k)}" for k, n in sorted(counts.items())), flush=True)
    for role, name in ((cluster.ROLE_BACKEND, "backend"), (ROLE_FRONTEND, "frontend")):
        mine = [w for w in seen if w[0] == role]
        if not mine:
            fail(f"the {name} never reconnected to the scheduler's address while the fake held it")
        taken = [how for _, how, refused in mine if not refused]
        if taken:
            fail(f"the {name} kept a link whose Welcome did not prove the join token ({', '.join(taken)})")
        if "does not prove the join token" not in log(tmp, name):
            fail(f"the {name} did not log the Welcome it refused:\n" + log(tmp, name)[-3000:])
        joined = fake.joined.get(role, 0)
        if joined > MAX_LINKS:
            fail(f"the {name} reconnected {joined} times in {FAKE_S:.0f} s to a scheduler address that refused "
                 f"it each time (at most {MAX_LINKS}: a refused link must back off like a failed attempt)")
        # Refused by the peer after a Welcome it received whole: counted.
        refused = len([w for w in mine if w[2]]) - fake.unsent.count(role)
        sent = fake.sent.get(role, 0)
        name_total = f"symphony_{name}_forged_welcomes_total"
        counted = cluster.metric(f"http://127.0.0.1:{metrics[name]}/metrics", name_total)
        print(f"security forged welcome: the {name} reached the fake {joined} times; {name_total} = {counted} "
              f"({refused} refused of {sent} sent)", flush=True)
        if counted is None or not refused <= counted <= sent:
            fail(f"the {name}'s {name_total} is {counted}, not between the {refused} Welcomes it refused "
                 f"and the {sent} the fake sent")

    # The fake is gone; the real scheduler comes back on the address.
    start_scheduler()
    started = time.monotonic()
    cluster.infer_within(url, BOUND_S)
    print(f"security forged welcome: after the fake, the real scheduler serves again within "
          f"{time.monotonic() - started:.1f} s", flush=True)
    print("security forged welcome: ok", flush=True)


if __name__ == "__main__":
    main()
