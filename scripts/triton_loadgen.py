#!/usr/bin/env python3
"""Open-loop (Poisson) load against any KServe-v2 / Open Inference Protocol server, over HTTP
(binary tensor extension, as perf_analyzer sends) or gRPC (raw_input_contents), for
scripts/triton-compare.sh: the same client for Triton and for Symphony.

Requests are sent on schedule whether or not earlier ones have returned (open loop). Every
answer is classified: ok (right output, within the model's SLO), late (right output, after it),
wrong (an output that is not the model's reference output for the input sent), failed (any
non-200 / gRPC error / transport error) and skipped (more than --max-in-flight outstanding:
counted as failed, never silently dropped). Inputs are drawn from a small pool of seeded
random tensors whose reference outputs were computed with ONNX Runtime directly
(--reference, written by `triton_loadgen.py reference`); every answer is checked against it.

Popularity can shift during the run: --mix "A=0.9,B=0.1;A=0.1,B=0.9" splits the run into
equal phases, each with its own shares of the total rate.

`ladder` prints one JSON line per rate: per model and in total sent/ok/late/wrong/failed/skipped
(skipped is part of failed), bad_rate, p50/p99 of all answers (ms; failures count at their time
to fail), the client's CPU time and the server process tree's CPU time per answered inference
(/proc of --server-pid and its descendants), and with --metrics (Symphony's Prometheus endpoints)
the server's own split of the rung (server_stages: each stage's mean per executed request, the
mean batch, late starts, drops, the learned GPU speed ratio); it stops after --stop-after-misses bad rates in a
row, bisects --refine times between the best good rate and the next bad one, and ends with {"goodput_rps": highest rate with bad_rate <= --max-bad}.
"""
import argparse
import asyncio
import json
import os
import random
import re
import resource
import sys
import time

import numpy as np


def reference_cmd(a):
    """Writes a pool of seeded inputs and ONNX Runtime's outputs for each model."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    out = {}
    for name in a.models.split(","):
        path = os.path.join(a.repository, name, "1", "model.onnx")
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        inp, outp = sess.get_inputs()[0], sess.get_outputs()[0]
        # the input's dims as the model's config.pbtxt declares them (the ONNX file may leave
        # them dynamic), with the batch dimension 1 in front
        with open(os.path.join(a.repository, name, "config.pbtxt")) as f:
            dims = re.search(r"input \[ \{[^}]*dims: \[([0-9, ]+)\]", f.read()).group(1)
        shape = [1] + [int(d) for d in dims.split(",")]
        rng = np.random.default_rng(a.seed)
        xs = rng.random((a.pool, *shape[1:]), dtype=np.float32)
        ys = np.concatenate([sess.run([outp.name], {inp.name: xs[i : i + 1]})[0] for i in range(a.pool)])
        out[f"{name}/x"] = xs
        out[f"{name}/y"] = ys
        out[f"{name}/names"] = np.array([inp.name, outp.name])
    np.savez(a.out, **out)


class Model:
    def __init__(self, name, ref, slo_ms):
        self.name = name
        self.xs = ref[f"{name}/x"]
        self.ys = ref[f"{name}/y"]
        self.inp, self.outp = [str(s) for s in ref[f"{name}/names"]]
        self.slo = slo_ms / 1e3
        self.out_bytes = int(np.prod(self.ys.shape[1:])) * 4
        self.http_bodies = []
        for x in self.xs:
            raw = x[None].tobytes()
            head = json.dumps({
                "inputs": [{"name": self.inp, "datatype": "FP32", "shape": [1, *x.shape],
                            "parameters": {"binary_data_size": len(raw)}}],
                "outputs": [{"name": self.outp, "parameters": {"binary_data": True}}],
            }).encode()
            self.http_bodies.append((head + raw, len(head)))
        self.errors_logged = 0
        self.counts = dict(sent=0, ok=0, late=0, wrong=0, failed=0, skipped=0)
        self.lat = []

    def check(self, k, y):
        ref = self.ys[k].reshape(-1)
        return y.shape == ref.shape and bool(np.allclose(y, ref, rtol=1e-3, atol=1e-4))


def decode_http(body, header_len, m):
    """The output tensor of an HTTP answer, binary or JSON."""
    if header_len is not None:
        head = json.loads(body[:header_len])
        out = head["outputs"][0]
        n = out.get("parameters", {}).get("binary_data_size")
        if n is not None:
            return np.frombuffer(body[header_len : header_len + n], dtype=np.float32)
    else:
        out = json.loads(body)["outputs"][0]
    return np.asarray(out["data"], dtype=np.float32).reshape(-1)


async def run(a):
    ref = np.load(a.reference)
    slos = dict(kv.split("=") for kv in a.slo_ms.split(","))
    phases = []
    for phase in a.mix.split(";"):
        shares = {k: float(v) for k, v in (kv.split("=") for kv in phase.split(","))}
        total = sum(shares.values())
        phases.append({k: v / total for k, v in shares.items()})
    models = {n: Model(n, ref, float(slos[n])) for n in phases[0]}
    rng = random.Random(a.seed)
    host = a.url

    if a.protocol == "http":
        import aiohttp

        conn = aiohttp.TCPConnector(limit=a.max_in_flight, force_close=False)
        session = aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=a.timeout_s))

        async def send(m, k):
            body, hlen = m.http_bodies[k]
            async with session.post(
                f"http://{host}/v2/models/{m.name}/infer", data=body,
                headers={"Content-Type": "application/octet-stream",
                         "Inference-Header-Content-Length": str(hlen)},
            ) as r:
                data = await r.read()
                if r.status != 200:
                    return f"HTTP {r.status}: {data[:200]!r}"
                h = r.headers.get("Inference-Header-Content-Length")
                return decode_http(data, int(h) if h else None, m)
    else:
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        channel = grpc.aio.insecure_channel(host, options=[
            ("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)])
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        reqs = {}
        for m in models.values():
            reqs[m.name] = []
            for x in m.xs:
                r = service_pb2.ModelInferRequest(model_name=m.name)
                t = r.inputs.add(name=m.inp, datatype="FP32")
                t.shape.extend([1, *x.shape])
                r.outputs.add(name=m.outp)
                r.raw_input_contents.append(x[None].tobytes())
                reqs[m.name].append(r)

        async def send(m, k):
            try:
                resp = await stub.ModelInfer(reqs[m.name][k], timeout=a.timeout_s)
            except grpc.aio.AioRpcError as e:
                return f"gRPC {e.code().name}: {e.details()}"
            if resp.raw_output_contents:
                return np.frombuffer(resp.raw_output_contents[0], dtype=np.float32)
            return np.asarray(resp.outputs[0].contents.fp32_contents, dtype=np.float32)

    # warm-up: a few requests per model (connections, first-run costs), not counted
    for m in models.values():
        for k in range(min(4, len(m.xs))):
            try:
                await send(m, k)
            except Exception:
                pass
    steps = []

    async def rung(rate):
        for m in models.values():
            m.counts = dict.fromkeys(m.counts, 0)
            m.lat = []
        srv0 = tree_cpu_s(a.server_pid)
        metrics0 = scrape(a.metrics) if a.metrics else None
        report = await step(a, rate, models, phases, send, rng)
        srv = tree_cpu_s(a.server_pid) - srv0
        if metrics0 is not None:
            report["server_stages"] = server_split(metrics0, scrape(a.metrics))
        answered = sum(report[k] for k in ("ok", "late", "wrong"))
        report["server_cpu_ms_per_inference"] = round(srv * 1e3 / answered, 3) if answered else None
        report["server_cpu_s"] = round(srv, 3)
        report["good"] = report["bad_rate"] <= a.max_bad
        print(json.dumps(report), flush=True)
        steps.append(report)
        return report["good"]

    best, misses = 0.0, 0
    for rate in [float(r) for r in a.rates.split()]:
        if await rung(rate):
            best, misses = rate, 0
        else:
            misses += 1
            if misses >= a.stop_after_misses:
                break
    # the first bad rate above the best good one; bisect between them
    bad = min((r["rate"] for r in steps if not r["good"] and r["rate"] > best), default=None)
    for _ in range(a.refine if bad is not None else 0):
        mid = round((best + bad) / 2, 1)
        if mid <= best or mid >= bad:
            break
        if await rung(mid):
            best = mid
        else:
            bad = mid
    if a.protocol == "http":
        await session.close()
    else:
        await channel.close()
    print(json.dumps({"goodput_rps": best, "steps": len(steps)}), flush=True)


METRIC_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([-+0-9.eE]+|[-+]?Inf|NaN)\s*$')


def scrape(urls):
    """Every numeric series of the Prometheus text endpoints `urls` (loopback only), summed
    over the endpoints: {"name{labels}": value}; an endpoint that does not answer adds nothing."""
    import urllib.request

    series = {}
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                text = r.read(8 << 20).decode("utf-8", "replace")
        except OSError:
            continue
        for line in text.splitlines():
            mt = METRIC_LINE.match(line)
            if mt:
                key = mt.group(1) + (mt.group(2) or "")
                series[key] = series.get(key, 0.0) + float(mt.group(3))
    return series


def server_split(before, after):
    """The rung's server-side split from two scrapes of Symphony's endpoints: each stage's mean
    per executed request (µs; symphony_stage_duration_us, frontend: network, queue, input,
    compute, output, which add up to the frontend's end-to-end time), the mean planned and
    executed batch, the backend's late starts (> 100 us) and mean start lateness, the answers
    the frontend counted late and the scheduler's decision lag."""
    d = {k: v - before.get(k, 0.0) for k, v in after.items()}

    def total(name, **labels):
        want = [f'{k}="{v}"' for k, v in labels.items()]
        return sum(v for k, v in d.items() if k.split("{")[0] == name and all(w in k for w in want))

    stages = {}
    for st in ("network", "queue", "input", "compute", "output"):
        n = total("symphony_stage_duration_us_count", stage=st)
        stages[st] = round(total("symphony_stage_duration_us_sum", stage=st) / n, 1) if n else None
    n = total("symphony_executed_request_duration_us_count")
    out = {"stages_us": stages,
           "end_to_end_us": round(total("symphony_executed_request_duration_us_sum") / n, 1) if n else None,
           "executed": int(n)}
    b = total("symphony_backend_batches_executed_total")
    out["batches"] = int(b)
    # late starts: batches started > 100 us after their planned time (the backend's threshold);
    # the mean lateness of every batch from the histogram symphony_backend_start_lateness_us
    out["late_starts"] = int(total("symphony_backend_late_starts_total"))
    ln = total("symphony_backend_start_lateness_us_count")
    out["mean_start_lateness_us"] = round(total("symphony_backend_start_lateness_us_sum") / ln, 1) if ln else None
    out["late_answers"] = int(total("symphony_requests_by_level_total", outcome="late"))
    bs_n, bs_sum = total("symphony_batch_size_count"), total("symphony_batch_size_sum")
    # symphony_batch_size is on both the scheduler (planned) and the backend (executed): the
    # sum over both endpoints counts each batch twice, the mean is unchanged
    out["mean_batch"] = round(bs_sum / bs_n, 2) if bs_n else None
    lag_n = total("symphony_dispatch_lag_us_count")
    out["dispatch_lag_us"] = round(total("symphony_dispatch_lag_us_sum") / lag_n, 1) if lag_n else None
    out["dropped"] = int(total("symphony_requests_dropped_total"))
    # the scheduler's learned measured/profiled batch time per GPU at the rung's end (a gauge:
    # not a difference); above 1 the executor runs slower than the profile it plans with
    ratios = [v for k, v in after.items() if k.split("{")[0] == "symphony_gpu_speed_ratio"]
    out["gpu_speed_ratio"] = round(max(ratios), 3) if ratios else None
    return out


def first_error(m, what):
    """Logs each model's first few failures to stderr (the counts say how many there were)."""
    if m.errors_logged < 3:
        m.errors_logged += 1
        print(f"{m.name}: {what}", file=sys.stderr)


def tree_cpu_s(root):
    """CPU seconds (user + system) of process `root` and all its descendants, from /proc."""
    if not root:
        return 0.0
    kids, cpu = {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        pid, ppid = int(d), int(rest[1])
        kids.setdefault(ppid, []).append(pid)
        cpu[pid] = int(rest[11]) + int(rest[12])
    total, todo = 0, [root]
    while todo:
        p = todo.pop()
        total += cpu.get(p, 0)
        todo.extend(kids.get(p, []))
    return total / os.sysconf("SC_CLK_TCK")


async def step(a, rate, models, phases, send, rng):
    """One open-loop run at `rate` requests/s for a.duration seconds."""
    inflight = 0

    async def one(m, k):
        nonlocal inflight
        t0 = time.perf_counter()
        try:
            y = await send(m, k)
        except Exception as e:  # any transport failure is a failed request, not a crash
            y = f"{type(e).__name__}: {e}"
        dt = time.perf_counter() - t0
        inflight -= 1
        m.lat.append(dt)
        if isinstance(y, str):
            m.counts["failed"] += 1
            first_error(m, y)
        elif not m.check(k, y):
            m.counts["wrong"] += 1
        elif dt > m.slo:
            m.counts["late"] += 1
        else:
            m.counts["ok"] += 1

    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    tasks = set()
    start = time.perf_counter()
    t = 0.0
    phase_len = a.duration / len(phases)
    names = list(models)
    while True:
        t += rng.expovariate(rate)
        if t >= a.duration:
            break
        shares = phases[min(int(t / phase_len), len(phases) - 1)]
        weights = [shares.get(n, 0.0) for n in names]
        m = models[rng.choices(names, weights)[0]]
        k = rng.randrange(len(m.xs))
        delay = start + t - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        m.counts["sent"] += 1
        if inflight >= a.max_in_flight:
            m.counts["skipped"] += 1
            m.counts["failed"] += 1
            continue
        inflight += 1
        task = asyncio.ensure_future(one(m, k))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    behind = time.perf_counter() - start - a.duration
    if tasks:
        await asyncio.wait(tasks)
    elapsed = time.perf_counter() - start
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)

    def summary(counts, lat):
        lat = sorted(lat)
        pct = lambda q: round(lat[min(len(lat) - 1, int(q * len(lat)))] * 1e3, 3) if lat else None
        bad = counts["sent"] - counts["ok"]
        return dict(counts, bad_rate=round(bad / counts["sent"], 5) if counts["sent"] else 0.0,
                    p50_ms=pct(0.5), p99_ms=pct(0.99))

    tot = {k: sum(m.counts[k] for m in models.values()) for k in models[names[0]].counts}
    report = summary(tot, [x for m in models.values() for x in m.lat])
    report.update(
        rate=rate, protocol=a.protocol, duration_s=a.duration, elapsed_s=round(elapsed, 3),
        schedule_lag_s=round(max(behind, 0.0), 3),
        client_cpu_s=round(cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime, 3),
        models={n: summary(m.counts, m.lat) for n, m in models.items()},
    )
    return report


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("reference", help="inputs and ONNX Runtime reference outputs")
    r.add_argument("--repository", required=True)
    r.add_argument("--models", required=True, help="NAME,NAME")
    r.add_argument("--pool", type=int, default=8)
    r.add_argument("--seed", type=int, default=1)
    r.add_argument("--out", required=True, help=".npz file")
    l = sub.add_parser("ladder", help="open-loop runs at rising rates: one JSON line per rate, then the goodput")
    l.add_argument("--url", required=True, help="HOST:PORT (loopback)")
    l.add_argument("--protocol", choices=["http", "grpc"], default="http")
    l.add_argument("--reference", required=True)
    l.add_argument("--mix", required=True, help="A=share,B=share[;next phase...]")
    l.add_argument("--slo-ms", required=True, help="A=ms,B=ms")
    l.add_argument("--rates", required=True, help="ladder of total rates, requests/s (Poisson), low to high")
    l.add_argument("--max-bad", type=float, default=0.01, help="a rate is good with at most this share late/failed/wrong")
    l.add_argument("--stop-after-misses", type=int, default=2, help="stop the ladder after this many bad rates in a row")
    l.add_argument("--refine", type=int, default=0, help="then bisect this many times between the best good rate and the next bad one")
    l.add_argument("--server-pid", type=int, default=0, help="server root pid: its process tree's CPU time is reported")
    l.add_argument("--metrics", action="append", default=[],
                   help="a Prometheus endpoint of the server (repeatable; Symphony's frontend, backends, scheduler): the rung's server-side split")
    l.add_argument("--duration", type=float, default=5.0)
    l.add_argument("--seed", type=int, default=1)
    l.add_argument("--max-in-flight", type=int, default=512)
    l.add_argument("--timeout-s", type=float, default=10.0)
    a = p.parse_args()
    if a.cmd == "reference":
        reference_cmd(a)
        return
    for u in [a.url] + [m.split("//", 1)[-1].split("/", 1)[0] for m in a.metrics]:
        if u.rsplit(":", 1)[0] not in ("127.0.0.1", "localhost", "[::1]"):
            sys.exit(f"refusing to contact {u}: loopback only")
    asyncio.run(run(a))


if __name__ == "__main__":
    main()
