#!/usr/bin/env python3
"""A member backend READing inputs that were not planned to it, over TCP
(issue 55: "a backend may read only the inputs of batches planned to it").

Starts `symphony up --serve --transport tcp` (a scheduler, a frontend and a
backend as processes). Then, as an attacker on the same host holding the
cluster's join token (a member), it
  1. registers with the scheduler as backend 4242 (a Join answering the
     challenge with the token, its Models, heartbeats) and joins the
     frontend's data port as that backend;
  2. stops the real backend (SIGSTOP) until the scheduler declares it dead,
     then sends an inference: the scheduler plans it to the attacker, whose
     plan names the staging region's key, the task's input and the task's
     capability;
  3. READs over its data link: the planned input presenting that task's
     capability (the control: served, so key and range are right), the same
     input presenting no capability, presenting another task id's, and a
     neighbouring range of the staging region (another task's slot)
     presenting the planned task's capability. Each of the last three must
     be refused (ReadStatus AccessDenied) and counted
     (`symphony_frontend_refused_reads`);
  4. resumes the real backend and leaves: the frontend serves inferences
     again, every daemon alive.
Exit 0 when all hold; 1 with the reason otherwise. Loopback only; bounded in
time (about 30 s).

On the session-start main (c5f2d45, wire version 8: a ReadRequest carries
no capability, the responder checks none), step 3 fails: the READ of the
planned input presenting no capability is served (and so is the
neighbouring slot's).

Usage: read_capability.py SYMPHONY_BINARY
"""
import os
import signal
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster  # noqa: E402
from cluster import (  # noqa: E402
    KIND_HEARTBEAT, KIND_READ_RESPONSE, READ_STATUS_OK, ROLE_BACKEND, Cluster, challenged, data_port, fail, frame,
    infer, infer_within, join_answer, member_link, metric, read_request, recv_exact, recv_frame, use_label)

ATTACKER_ID = 4242
KIND_BATCH_PLAN, KIND_MODELS, KIND_WELCOME, KIND_REFUSED = 4, 10, 13, 14
READ_STATUS_ACCESS_DENIED = 4
PLAN_HEAD = struct.Struct("<QQQIIII")          # batch id, exec_in, run_ns, model, gpu, count, epoch
PLAN_TASK = struct.Struct("<QIIIIQ16s")        # task, frontend, queued_us, RemoteRef{key, len, offset}, capability


def scheduler_member(control, token, backend_id, model_ids):
    """A control link registered with the scheduler as backend
    `backend_id` serving `model_ids` on one GPU (Join signed with the
    token, then Models); returns the socket once welcomed."""
    s, nonce = challenged(int(control.rsplit(":", 1)[1]))
    s.sendall(join_answer(nonce, token, ROLE_BACKEND, backend_id))
    version = cluster.VERSION
    ids = b"".join(struct.pack("<I", m) for m in model_ids)
    s.sendall(frame(version, KIND_MODELS, 8 + len(ids), struct.pack("<II", len(model_ids), 0) + ids))
    reply = recv_frame(s)
    if reply is None or reply[0] != KIND_WELCOME:
        fail(f"the scheduler did not welcome a member backend: {reply!r}")
    return s


def heartbeats(s, stop):
    """Keeps the attacker's scheduler link alive until `stop` is set."""
    seq = 0
    while not stop.is_set():
        seq += 1
        body = struct.pack("<QII", seq, ROLE_BACKEND, ATTACKER_ID)
        try:
            s.sendall(frame(cluster.VERSION, KIND_HEARTBEAT, len(body), body))
        except OSError:
            return
        stop.wait(0.1)


def first_plan(s, until):
    """The tasks of the first BatchPlan on the attacker's scheduler link."""
    s.settimeout(max(0.1, until - time.monotonic()))
    while time.monotonic() < until:
        f = recv_frame(s)
        if f is None:
            fail("the scheduler closed the attacker's link before planning to it")
        kind, body = f
        if kind != KIND_BATCH_PLAN:
            continue
        head = PLAN_HEAD.unpack_from(body)
        count = head[5]
        return [PLAN_TASK.unpack_from(body, PLAN_HEAD.size + i * PLAN_TASK.size) for i in range(count)]
    fail("no batch was planned to the attacker")


def read_status(s, key, offset, length, task, capability):
    """The status of one READ on data link `s` (control messages the
    frontend sends in between are skipped)."""
    s.sendall(read_request(key, offset, length, task=task, capability=capability))
    for _ in range(64):
        f = recv_frame(s)
        if f is None:
            fail("the data link closed instead of answering a READ")
        kind, body = f
        if kind == KIND_READ_RESPONSE:
            break
    else:
        fail("no ReadResponse among 64 frames")
    _wr_id, status, n = struct.unpack("<QII", body[:16])
    if status == READ_STATUS_OK and recv_exact(s, n) is None:
        fail("a served READ's payload was cut")
    return status


def main():
    if len(sys.argv) != 2:
        fail("usage: read_capability.py SYMPHONY_BINARY")
    use_label("security read capability")
    with Cluster(sys.argv[1], prefix="symphony-security-readcap-") as c:
        run(c)


def run(c):
    url = c.url()
    fe_metrics = c.printed(r"^frontend 1 metrics: (http://\S+)$")
    sched_metrics = c.printed(r"^scheduler metrics: (http://\S+)$")
    control = c.printed(r"^scheduler control: (\S+)$")
    token = c.token()
    infer_within(url, 30)
    frontends, backends = c.role_pids("frontend"), c.role_pids("backend")
    port = data_port(frontends[0]) if len(frontends) == 1 else None
    if port is None or len(backends) != 1:
        fail(f"expected one frontend with a data port and one backend (pids {c.daemons})")

    # 1. A member: registered with the scheduler, joined to the data port.
    sched = scheduler_member(control, token, ATTACKER_ID, [0])
    stop = threading.Event()
    beat = threading.Thread(target=heartbeats, args=(sched, stop), daemon=True)
    beat.start()
    data = member_link(port, token, ATTACKER_ID)
    data.settimeout(5)
    try:
        # 2. Only the attacker left to plan to.
        deaths = metric(sched_metrics, "symphony_backend_deaths_total") or 0
        os.kill(backends[0], signal.SIGSTOP)
        try:
            until = time.monotonic() + 10
            while (metric(sched_metrics, "symphony_backend_deaths_total") or 0) <= deaths:
                if time.monotonic() > until:
                    fail("the scheduler did not declare the stopped backend dead within 10 s")
                time.sleep(0.1)
            client = threading.Thread(target=lambda: _quiet(infer, url, 3), daemon=True)
            client.start()
            tasks = first_plan(sched, time.monotonic() + 10)
        finally:
            os.kill(backends[0], signal.SIGCONT)
        if not tasks:
            fail("the attacker's plan holds no task")
        task, _fe, _queued, key, length, offset, cap = tasks[0]

        # 3. READs with and without the plan's capability.
        refused_before = metric(fe_metrics, "symphony_frontend_refused_reads_total") or 0
        served = read_status(data, key, offset, length, task, cap)
        if served != READ_STATUS_OK:
            fail(f"the planned input presenting its own capability was not served (status {served})")
        neighbour = offset - length if offset >= length else offset + length
        attacks = [
            ("its input presenting no capability", (key, offset, length, task, b"\0" * 16)),
            ("its input presenting another task id's claim", (key, offset, length, task ^ 1, cap)),
            ("a neighbouring slot presenting the planned task's capability", (key, neighbour, length, task, cap)),
        ]
        for what, args in attacks:
            status = read_status(data, *args)
            if status != READ_STATUS_ACCESS_DENIED:
                fail(f"a READ of {what} was answered with status {status} (0: served), not AccessDenied")
        refused = metric(fe_metrics, "symphony_frontend_refused_reads_total")
        if refused is None or refused - refused_before < len(attacks):
            fail(f"{len(attacks)} READs refused, but the frontend counts {refused} (before: {refused_before})")
        print(f"security read capability: task {task:#x}'s input served with its capability; "
              f"{len(attacks)} READs without it refused and counted", flush=True)
    finally:
        stop.set()
        data.close()
        sched.close()
    beat.join(timeout=2)

    # 4. The real backend is back; the frontend serves.
    infer_within(url, 30)
    c.check_alive()
    print("security read capability: ok", flush=True)


def _quiet(f, *args):
    try:
        f(*args)
    except Exception:  # noqa: BLE001 - the request planned to the attacker never completes
        pass


if __name__ == "__main__":
    main()
