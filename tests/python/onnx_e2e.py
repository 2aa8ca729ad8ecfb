#!/usr/bin/env python3
"""Checks a running `symphony up --model-repository` (see tests/onnx_daemons.sh).

usage: onnx_e2e.py HOST:PORT MODELS_DIR
"""
import json
import sys
import urllib.error
import urllib.request

import numpy as np
import onnxruntime as ort

host, models = sys.argv[1], sys.argv[2]
OUT = {"ppocr_cls": "save_infer_model/scale_0.tmp_1", "open_nsfw": "outputs", "broken": "save_infer_model/scale_0.tmp_1"}
INP = {"ppocr_cls": "x", "open_nsfw": "input:0", "broken": "x"}
failures = []


def infer(model, x, name=None, datatype="FP32", shape=None, raw=None, path=None):
    raw = x.tobytes() if raw is None else raw
    hdr = json.dumps({
        "inputs": [{"name": name or INP.get(model, "x"), "datatype": datatype, "shape": shape or list(x.shape),
                    "parameters": {"binary_data_size": len(raw)}}],
        "outputs": [{"name": OUT.get(model, "y"), "parameters": {"binary_data": False}}],
    }).encode()
    url = f"http://{host}{path or f'/v2/models/{model}/infer'}"
    req = urllib.request.Request(url, data=hdr + raw, headers={
        "Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(hdr))})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def check(what, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + what + (f": {detail}" if detail and not ok else ""))
    if not ok:
        failures.append(what)


def metric(name):
    text = urllib.request.urlopen(f"http://{host}/metrics", timeout=10).read().decode()
    return sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith(name + " ") or l.startswith(name + "{"))


rng = np.random.default_rng(7)
for model, shape in [("ppocr_cls", [1, 3, 48, 192]), ("open_nsfw", [1, 224, 224, 3])]:
    sess = ort.InferenceSession(f"{models}/{model}/1/model.onnx", providers=["CPUExecutionProvider"])
    for i in range(3):
        x = rng.random(shape, dtype=np.float32)
        want = sess.run(None, {INP[model]: x})[0].reshape(-1)
        code, body = infer(model, x)
        got = np.array(body.get("outputs", [{}])[0].get("data", []), dtype=np.float32) if code == 200 else None
        check(f"{model} request {i}: 200 and equal to Python onnxruntime within 1e-5",
              code == 200 and got is not None and got.shape == want.shape and np.max(np.abs(got - want)) <= 1e-5,
              f"{code} {body}")

x = rng.random([1, 3, 48, 192], dtype=np.float32)
code, body = infer("ppocr_cls", x, shape=[1, 3, 48, 100], raw=x.tobytes()[: 3 * 48 * 100 * 4])
check("wrong shape -> 400 naming the shape", code == 400 and "shape" in body.get("error", ""), f"{code} {body}")
code, body = infer("ppocr_cls", x, datatype="INT32")
check("wrong datatype -> 400 naming the datatype", code == 400 and "datatype" in body.get("error", ""), f"{code} {body}")
code, body = infer("ppocr_cls", x, raw=x.tobytes()[:1000])
check("wrong byte size -> 400 naming the bytes", code == 400 and "bytes" in body.get("error", ""), f"{code} {body}")
code, body = infer("no_such_model", x)
check("unknown model -> 404", code == 404 and "unknown model" in body.get("error", ""), f"{code} {body}")
code, body = infer("ppocr_cls", x, path="/v2/models/ppocr_cls/versions/7/infer")
check("unknown version -> 404", code == 404 and "version" in body.get("error", ""), f"{code} {body}")
xb = rng.random([1, 4, 48, 192], dtype=np.float32)  # what its (wrong) config declares
for _ in range(5):  # a 503 (dropped under a loaded machine's stall) is retried
    code, body = infer("broken", xb)
    if code != 503:
        break
check("a model that failed to load -> 5xx naming it", 500 <= code < 600 and "failed to load" in body.get("error", ""), f"{code} {body}")
want = ort.InferenceSession(f"{models}/ppocr_cls/1/model.onnx", providers=["CPUExecutionProvider"]).run(None, {"x": x})[0].reshape(-1)
code, body = infer("ppocr_cls", x)
got = np.array(body.get("outputs", [{}])[0].get("data", []), dtype=np.float32) if code == 200 else None
check("the other models are unaffected", code == 200 and got is not None and np.max(np.abs(got - want)) <= 1e-5, f"{code} {body}")
acc = metric("symphony_requests_accepted_total")
done = sum(metric(f"symphony_requests_{k}_total") for k in ("succeeded", "dropped", "failed"))
check(f"accounting exact: accepted {acc:.0f} = succeeded + dropped + failed {done:.0f}", acc == done and acc >= 8)
if failures:
    print(f"{len(failures)} checks failed")
    sys.exit(1)
print("all real-model checks passed")
