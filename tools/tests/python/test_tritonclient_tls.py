"""Triton's clients with their SSL options against a Symphony frontend serving
HTTP and gRPC over TLS with the self-signed test certificate
(tools/tests/data/tls). Addresses from SYMPHONY_TLS_URL / SYMPHONY_TLS_GRPC_URL
(host:port; the certificate names localhost), set by run.sh."""

import os
import ssl

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from test_tritonclient import MODEL, reference_output

HERE = os.path.dirname(os.path.abspath(__file__))
CERT = os.path.join(HERE, "..", "data", "tls", "cert.pem")
HTTP_URL = os.environ.get("SYMPHONY_TLS_URL", "localhost:8443")
GRPC_URL = os.environ.get("SYMPHONY_TLS_GRPC_URL", "localhost:8444")


def data():
    return (np.arange(16, dtype=np.float32).reshape(1, 16) * 0.75 + 1).astype(np.float32)


def test_https_with_the_certificate_as_root():
    c = httpclient.InferenceServerClient(
        url=HTTP_URL, ssl=True,
        ssl_context_factory=lambda: ssl.create_default_context(cafile=CERT))
    assert c.is_server_live()
    x = data()
    inp = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    np.testing.assert_array_equal(c.infer(MODEL, [inp]).as_numpy("OUTPUT0"), reference_output(x))


def test_grpc_over_tls_with_the_certificate_as_root():
    c = grpcclient.InferenceServerClient(url=GRPC_URL, ssl=True, root_certificates=CERT)
    assert c.is_server_live()
    x = data()
    inp = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
    inp.set_data_from_numpy(x)
    np.testing.assert_array_equal(c.infer(MODEL, [inp]).as_numpy("OUTPUT0"), reference_output(x))


if __name__ == "__main__":
    for name, fn in list(globals().items()):
        if name.startswith("test_") and callable(fn):
            fn()
            print(f"{name}: ok")
