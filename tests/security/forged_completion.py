#!/usr/bin/env python3
"""A member backend forging Completions (issue 55: "a forged Completion is
refused").

Starts `symphony up --serve --transport tcp` (a scheduler, a frontend and a
backend as processes) and serves one inference, to learn the real output.
Then, as an attacker on the same host holding the cluster's join token (a
member: it joins the frontend's data port as backend 4242, like a real
backend), it
  1. stops the real backend (SIGSTOP, for at most 0.6 s: well inside the
     1 s after which the scheduler would declare it dead), sends an
     inference, and while that request waits for the stopped backend
     sprays Completions with status Ok and a forged output (every value
     250) for the task ids a frontend hands out first (slots 0..255,
     sequences 1..4: ids are per slot and count up), until the request is
     answered or the time is up; then resumes the backend;
  2. checks that the client never got the forged output, that the
     frontend counted the refusals (`symphony_frontend_refused_completions`)
     and that it still serves inferences (the attacker's link may stay
     open: a refused completion is not a protocol error).
Every daemon must be alive at the end. Exit 0 when all hold; 1 with the
reason otherwise. Loopback only; bounded in time (about 30 s).

On the parent of the commit that added it (wire version 7, no
capabilities): step 2 fails: the forged output reached the client (HTTP
200 with every value 250) and the metric does not exist.

Usage: forged_completion.py SYMPHONY_BINARY
"""
import os
import random
import signal
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402
from cluster import (  # noqa: E402
    KIND_COMPLETION, Cluster, data_port, fail, frame, infer, infer_within, member_link, metric, use_label)

ATTACKER_ID = 4242
FORGED_VALUE = 250  # not among the emulated model's outputs (checked)
SLOTS, SEQS = 256, 4
STOPPED_S = 0.6
# TaskId layout (dataplane::ids): frontend << 52 | seq << 20 | slot.
SLOT_BITS, SEQ_BITS = 20, 32


def task_id(frontend, seq, slot):
    return frontend << (SLOT_BITS + SEQ_BITS) | seq << SLOT_BITS | slot


def completion(version, task, inline, rng):
    """A Completion{status Ok, inline output} for `task`, in the layout of
    wire `version` (from 8 on: the sender's backend id, a reserved word and
    a 16-byte capability follow the head; the attacker has none to give, so
    it guesses)."""
    head = struct.pack("<QIIIIIIQIIQQQ", task, 0, 1, len(inline), 0, 0, 0, 0, 0, 0, 0, 0, 0)
    if version >= 8:
        head += struct.pack("<II", ATTACKER_ID, 0) + bytes(rng.getrandbits(8) for _ in range(16))
    body = head + inline
    return frame(version, KIND_COMPLETION, len(body), body)


def main():
    use_label("security forged completion")
    if len(sys.argv) != 2:
        fail("usage: forged_completion.py SYMPHONY_BINARY")
    with Cluster(sys.argv[1], prefix="symphony-security-forged-") as c:
        run(c)


def run(c):
    url = c.url()
    metrics = c.printed(r"^frontend 1 metrics: (http://\S+)$")
    real = infer_within(url, 30)["outputs"][0]
    fmt = {"FP32": "<f", "UINT8": "<B", "INT32": "<i"}.get(real.get("datatype"))
    if fmt is None or FORGED_VALUE in real["data"]:
        fail(f"expected an FP32, UINT8 or INT32 output without the value {FORGED_VALUE}: {str(real)[:200]}")
    inline = struct.pack(fmt, FORGED_VALUE) * len(real["data"])
    frontends, backends = c.role_pids("frontend"), c.role_pids("backend")
    port = data_port(frontends[0]) if len(frontends) == 1 else None
    if port is None or len(backends) != 1:
        fail(f"expected one frontend with a data port and one backend (pids {c.daemons})")
    version = cluster.VERSION
    rng = random.Random(55)
    forged = b"".join(completion(version, task_id(1, seq, slot), inline, rng)
                      for seq in range(1, SEQS + 1) for slot in range(SLOTS))

    answer = {}

    def client():
        try:
            answer["outputs"] = infer(url)["outputs"]
        except Exception as e:  # noqa: BLE001 - an error is no forged output
            answer["error"] = str(e)

    with member_link(port, c.token(), ATTACKER_ID) as s:
        os.kill(backends[0], signal.SIGSTOP)
        try:
            t = threading.Thread(target=client)
            t.start()
            until, rounds = time.monotonic() + STOPPED_S, 0
            while time.monotonic() < until and t.is_alive():
                s.sendall(forged)
                rounds += 1
                time.sleep(0.05)
        finally:
            os.kill(backends[0], signal.SIGCONT)
        t.join(timeout=15)
    if t.is_alive():
        fail("the inference sent during the attack got no answer within 15 s")
    got = answer.get("outputs")
    if got and all(v == FORGED_VALUE for v in got[0]["data"]):
        fail(f"a forged Completion reached the client (every value {FORGED_VALUE}) after {rounds} rounds")
    refused = metric(metrics, "symphony_frontend_refused_completions_total")
    if not refused:
        fail(f"{rounds} rounds of {SLOTS * SEQS} forged Completions, but the frontend counts {refused} refused")
    print(f"security forged completion: {rounds} rounds of {SLOTS * SEQS} forged Completions; {refused:.0f} "
          f"naming the request in flight refused and counted; the client got "
          f"{'the real output' if got else 'no forged output (' + answer.get('error', '')[:80] + ')'}", flush=True)
    infer_within(url, 10)
    c.check_alive()
    print("security forged completion: ok", flush=True)


if __name__ == "__main__":
    main()
