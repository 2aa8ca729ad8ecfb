"""The official Triton gRPC client (tritonclient[grpc]) against the Symphony
frontend's KServe v2 gRPC API (inference.GRPCInferenceService). The server
address comes from SYMPHONY_GRPC_URL (host:port), the model from
SYMPHONY_MODEL / SYMPHONY_MODEL_ID, set by run.sh. Runs under pytest or as a
plain script."""

import os

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from test_tritonclient import ADMIN_TOKEN, MODEL, admin_headers, reference_output

URL = os.environ.get("SYMPHONY_GRPC_URL", "127.0.0.1:8001")


def client():
    return grpcclient.InferenceServerClient(url=URL)


def make_input(seed: int):
    data = (np.arange(16, dtype=np.float32).reshape(1, 16) * 0.25 + seed).astype(np.float32)
    inp = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
    inp.set_data_from_numpy(data)
    return inp, data


def test_health_and_metadata():
    c = client()
    assert c.is_server_live()
    assert c.is_server_ready()
    assert c.is_model_ready(MODEL)
    meta = c.get_server_metadata(as_json=True)
    assert meta["name"] == "symphony"
    assert "statistics" in meta["extensions"]
    m = c.get_model_metadata(MODEL, as_json=True)
    assert m["inputs"][0]["name"] == "INPUT0"
    assert m["inputs"][0]["datatype"] == "FP32"
    assert [int(d) for d in m["inputs"][0]["shape"]] == [1, 16]
    cfg = c.get_model_config(MODEL, as_json=True)["config"]
    assert cfg["name"] == MODEL
    assert cfg["input"][0]["data_type"] == "TYPE_FP32"
    if ADMIN_TOKEN:
        index = c.get_model_repository_index(headers=admin_headers("authorization"), as_json=True)
        assert any(e["name"] == MODEL for e in index["models"])
    expect_error(lambda: c.get_model_repository_index(as_json=True), "UNAUTHENTICATED" if ADMIN_TOKEN else "PERMISSION_DENIED")


def test_infer_raw_contents():
    c = client()
    for seed in range(5):
        inp, data = make_input(seed)
        out = grpcclient.InferRequestedOutput("OUTPUT0")
        r = c.infer(MODEL, [inp], outputs=[out], request_id=f"r{seed}")
        assert r.get_response().id == f"r{seed}"
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), reference_output(data))


def test_infer_typed_contents():
    # tritonclient always sends raw_input_contents: build a request with
    # typed contents (fp32_contents) through the generated stub instead.
    from tritonclient.grpc import service_pb2

    c = client()
    data = (np.arange(16, dtype=np.float32).reshape(1, 16) * 0.5 - 3).astype(np.float32)
    req = service_pb2.ModelInferRequest(model_name=MODEL, id="typed")
    t = req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
    t.contents.fp32_contents.extend(data.flatten().tolist())
    resp = c._client_stub.ModelInfer(req, timeout=10)
    assert resp.id == "typed"
    out = np.frombuffer(resp.raw_output_contents[0], dtype=np.uint8).reshape(1, 40)
    np.testing.assert_array_equal(out, reference_output(data))


def test_stream_infer():
    # ModelStreamInfer through tritonclient's stream API: every request is
    # answered on the stream by id; a bad one comes back as an error and
    # the stream goes on.
    import queue

    answers = queue.Queue()
    c = client()
    c.start_stream(callback=lambda result, error: answers.put((result, error)))
    sent = {}
    for seed in range(6):
        inp, data = make_input(seed)
        sent[f"st{seed}"] = data
        c.async_stream_infer(MODEL, [inp], request_id=f"st{seed}")
    bad = grpcclient.InferInput("INPUT0", [1, 15], "FP32")
    bad.set_data_from_numpy(np.zeros((1, 15), dtype=np.float32))
    c.async_stream_infer(MODEL, [bad], request_id="bad")
    got, errors = {}, []
    for _ in range(len(sent) + 1):
        result, error = answers.get(timeout=30)
        if error is not None:
            errors.append(str(error))
        else:
            got[result.get_response().id] = result.as_numpy("OUTPUT0")
    c.stop_stream()
    assert len(errors) == 1 and "shape" in errors[0].lower(), errors
    assert sorted(got) == sorted(sent)
    for rid, data in sent.items():
        np.testing.assert_array_equal(got[rid], reference_output(data))


def test_statistics_count_successes():
    c = client()

    def successes():
        s = c.get_inference_statistics(MODEL, as_json=True)["model_stats"][0]
        return int(s["inference_stats"]["success"].get("count", 0)), s

    before, _ = successes()
    for seed in range(4):
        inp, _ = make_input(100 + seed)
        c.infer(MODEL, [inp])
    after, s = successes()
    assert after - before == 4, (before, after)
    assert int(s.get("inference_count", 0)) >= 4
    assert int(s["inference_stats"]["success"].get("ns", 0)) > 0


def expect_error(fn, *words):
    try:
        fn()
    except InferenceServerException as e:
        text = (str(e.status()) + " " + e.message()).lower()
        for w in words:
            assert w.lower() in text, (w, text)
        return
    raise AssertionError("expected an error")


def test_bad_input():
    c = client()
    expect_error(lambda: c.get_model_metadata("no_such_model"), "NOT_FOUND", "unknown model")
    expect_error(lambda: c.get_model_metadata(MODEL, model_version="99"), "NOT_FOUND")
    inp, _ = make_input(1)
    expect_error(lambda: c.infer("no_such_model", [inp]), "NOT_FOUND")
    wrong_shape = grpcclient.InferInput("INPUT0", [2, 8], "FP32")
    wrong_shape.set_data_from_numpy(np.zeros((2, 8), dtype=np.float32))
    expect_error(lambda: c.infer(MODEL, [wrong_shape]), "INVALID_ARGUMENT", "shape")
    wrong_type = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
    wrong_type.set_data_from_numpy(np.zeros((1, 16), dtype=np.int32))
    expect_error(lambda: c.infer(MODEL, [wrong_type]), "INVALID_ARGUMENT", "datatype")
    wrong_name = grpcclient.InferInput("X", [1, 16], "FP32")
    wrong_name.set_data_from_numpy(np.zeros((1, 16), dtype=np.float32))
    expect_error(lambda: c.infer(MODEL, [wrong_name]), "INVALID_ARGUMENT", "unexpected inference input")
    # Still serving.
    inp, data = make_input(7)
    np.testing.assert_array_equal(c.infer(MODEL, [inp]).as_numpy("OUTPUT0"), reference_output(data))


def test_model_control_over_grpc_and_http():
    import tritonclient.http as httpclient

    from test_tritonclient import URL as HTTP_URL

    # Without the admin credential nothing is unloaded.
    expect_error(lambda: client().unload_model(MODEL), "UNAUTHENTICATED" if ADMIN_TOKEN else "PERMISSION_DENIED")
    assert client().is_model_ready(MODEL)
    if not ADMIN_TOKEN:
        return
    grpc_admin = admin_headers("authorization")
    for ctl, hdr in ((client(), grpc_admin), (httpclient.InferenceServerClient(url=HTTP_URL), admin_headers())):
        ctl.unload_model(MODEL, headers=hdr)
        assert not ctl.is_model_ready(MODEL)
        inp, _ = make_input(3)
        expect_error(lambda: client().infer(MODEL, [inp]), "UNAVAILABLE", "unloaded")
        index = client().get_model_repository_index(headers=grpc_admin, as_json=True)["models"]
        assert [e.get("state") for e in index if e["name"] == MODEL] == ["UNAVAILABLE"]
        ctl.load_model(MODEL, headers=hdr)
        assert ctl.is_model_ready(MODEL)
        inp, data = make_input(4)
        np.testing.assert_array_equal(client().infer(MODEL, [inp]).as_numpy("OUTPUT0"), reference_output(data))
    expect_error(lambda: client().load_model("no_such_model", headers=grpc_admin), "NOT_FOUND")


if __name__ == "__main__":
    for name, fn in list(globals().items()):
        if name.startswith("test_") and callable(fn):
            fn()
            print(f"{name}: ok")
