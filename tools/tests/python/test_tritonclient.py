"""The official Triton HTTP client (tritonclient[http]) against the Symphony
frontend's KServe v2 API. The server URL comes from SYMPHONY_URL
(host:port), set by run.sh. Runs under pytest or as a plain script."""

import os

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

URL = os.environ.get("SYMPHONY_URL", "127.0.0.1:8000")
MODEL = os.environ.get("SYMPHONY_MODEL", "ResNet50")
# The frontend's admin token (--admin-token-file): model control and the
# repository index need it; unset, the server is expected to refuse them.
ADMIN_TOKEN = os.environ.get("SYMPHONY_ADMIN_TOKEN")


def admin_headers(key="Authorization"):
    """The admin credential as tritonclient's `headers` (gRPC metadata keys
    are lower case: pass key="authorization")."""
    return {key: "Bearer " + ADMIN_TOKEN} if ADMIN_TOKEN else None


def client():
    return httpclient.InferenceServerClient(url=URL, connection_timeout=10.0, network_timeout=10.0)


MODEL_ID = int(os.environ.get("SYMPHONY_MODEL_ID", "2"))
MASK = 0xFFFFFFFFFFFFFFFF


def reference_output(inp: np.ndarray, model_id: int = MODEL_ID, n: int = 40) -> np.ndarray:
    """dataplane::reference::expected_output over the input's little-endian
    bytes: h = FNV offset; fold the model id, each full 8-byte LE word, each
    remaining byte, then the length (fold: h = (h ^ x) * FNV prime);
    output byte j = byte j % 8 of h (LE) XOR (j / 8)."""
    data = inp.astype("<f4").tobytes()

    def fold(h, x):
        return ((h ^ x) * 0x100000001B3) & MASK

    h = fold(0xCBF29CE484222325, model_id)
    full = len(data) // 8 * 8
    for i in range(0, full, 8):
        h = fold(h, int.from_bytes(data[i:i + 8], "little"))
    for b in data[full:]:
        h = fold(h, b)
    h = fold(h, len(data))
    hb = h.to_bytes(8, "little")
    return np.array([hb[j % 8] ^ ((j // 8) & 0xFF) for j in range(n)], dtype=np.uint8).reshape(1, n)


def make_input(seed: int, binary: bool):
    data = (np.arange(16, dtype=np.float32).reshape(1, 16) * 0.25 + seed).astype(np.float32)
    inp = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    inp.set_data_from_numpy(data, binary_data=binary)
    return inp, data


def test_health_and_server_metadata():
    c = client()
    assert c.is_server_live()
    assert c.is_server_ready()
    meta = c.get_server_metadata()
    assert meta["name"] == "symphony"
    assert "binary_tensor_data" in meta["extensions"]


def test_model_metadata_config_and_index():
    c = client()
    assert c.get_model_metadata("ResNet50")["platform"] == "symphony_emulated"
    assert c.is_model_ready(MODEL)
    assert c.is_model_ready(MODEL, "1")
    meta = c.get_model_metadata(MODEL)
    assert meta["name"] == MODEL
    assert meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16]}]
    assert meta["outputs"] == [{"name": "OUTPUT0", "datatype": "UINT8", "shape": [1, 40]}]
    cfg = c.get_model_config(MODEL)
    assert cfg["name"] == MODEL
    if ADMIN_TOKEN:
        index = c.get_model_repository_index(headers=admin_headers())
        assert MODEL in [m["name"] for m in index]
        expect_error(lambda: c.get_model_repository_index(), "401")
        expect_error(lambda: c.unload_model(MODEL, headers={"Authorization": "Bearer not-the-admin-token"}), "401")
    else:
        expect_error(lambda: c.get_model_repository_index(), "403")
    expect_error(lambda: c.unload_model(MODEL), "401" if ADMIN_TOKEN else "403")
    assert c.is_model_ready(MODEL)


def test_infer_binary_and_json_tensors():
    c = client()
    for i, binary in enumerate([True, False]):
        inp, data = make_input(i, binary)
        out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
        res = c.infer(MODEL, [inp], outputs=[out], request_id=f"py-{i}")
        got = res.as_numpy("OUTPUT0")
        assert got.shape == (1, 40)
        np.testing.assert_array_equal(got, reference_output(data))
        assert res.get_response()["id"] == f"py-{i}"
        assert res.get_response()["model_name"] == MODEL


def test_async_infer_many_in_flight_get_their_own_outputs():
    c = httpclient.InferenceServerClient(url=URL, concurrency=8)
    pending = []
    for i in range(32):
        inp, data = make_input(100 + i, True)
        pending.append((c.async_infer(MODEL, [inp], request_id=str(i)), data, i))
    ok = 0
    for req, data, i in pending:
        try:
            res = req.get_result()
        except InferenceServerException as e:  # a drop under burst is a 503, never a wrong answer
            assert str(e.status()) == "503", e
            continue
        assert res.get_response()["id"] == str(i)
        np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), reference_output(data))
        ok += 1
    assert ok > 0


def expect_error(fn, status):
    try:
        fn()
    except InferenceServerException as e:
        assert str(e.status()) == status, (e.status(), e.message())
        assert e.message()
        return
    raise AssertionError(f"expected HTTP {status}")


def test_protocol_errors():
    c = client()
    inp, _ = make_input(0, True)
    expect_error(lambda: c.infer("no_such_model", [inp]), "404")
    expect_error(lambda: c.get_model_metadata("no_such_model"), "404")
    bad_shape = httpclient.InferInput("INPUT0", [2, 8], "FP32")
    bad_shape.set_data_from_numpy(np.zeros((2, 8), dtype=np.float32))
    expect_error(lambda: c.infer(MODEL, [bad_shape]), "400")
    bad_type = httpclient.InferInput("INPUT0", [1, 16], "INT32")
    bad_type.set_data_from_numpy(np.zeros((1, 16), dtype=np.int32))
    expect_error(lambda: c.infer(MODEL, [bad_type]), "400")
    bad_name = httpclient.InferInput("WRONG", [1, 16], "FP32")
    bad_name.set_data_from_numpy(np.zeros((1, 16), dtype=np.float32))
    expect_error(lambda: c.infer(MODEL, [bad_name]), "400")


if __name__ == "__main__":
    for name, fn in list(globals().items()):
        if name.startswith("test_") and callable(fn):
            fn()
            print("ok", name)
