#!/usr/bin/env bash
# Runs the tritonclient tests against the in-process stack (tools' serve example).
# Installs tritonclient[http,grpc] (and pytest) if missing, builds and starts
# `cargo run -p tools --example serve -- --port 0 --print-port`, runs the
# tests, and stops the server. Bounded in time; leaves no process behind.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target/frontend}"
PY="${PYTHON:-python3}"

if ! "$PY" -c "import tritonclient.http, tritonclient.grpc, numpy" 2>/dev/null; then
    timeout 600 "$PY" -m pip install -q "tritonclient[http,grpc]"
fi
have_pytest=1
"$PY" -c "import pytest" 2>/dev/null || have_pytest=0

# Release, like every other build of tests/run.sh: the release dependencies are
# already built there, while a debug build would compile the whole tree again.
# RELEASE_BUILD (tests/run.sh): its test step's build command, a no-op here.
(cd "$root" && timeout 900 ${RELEASE_BUILD:-cargo build --release -p tools --example serve} -q)
bin="$CARGO_TARGET_DIR/release/examples/serve"

tmp="$(mktemp -d)"
fifo="$tmp/stdin"
mkfifo "$fifo"
# The server exits when its stdin closes (--exit-on-stdin-eof): holding the
# fifo open on fd 9 keeps it alive; closing fd 9 (or this script dying)
# stops it even if the kill below is never reached.
# ResNet50 and DenseNet121 from the A100 zoo (20 and 21 ms SLOs), plus
# tc_model with a 200 ms SLO: the functional tests use tc_model so that a
# loaded 2-core machine (timer wakes late) cannot turn them into drops.
# The output files exist before the polls below read them (the background
# job opens its redirections only once it runs; see tests/lib/up_serve.sh).
: >"$tmp/out"; : >"$tmp/err"; : >"$tmp/out-tls"; : >"$tmp/err-tls"
# Model control and the repository index need the admin credential (issue
# 55): the tests send it (SYMPHONY_ADMIN_TOKEN) and check that a call
# without it is refused.
admin_token="admin-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
printf '%s\n' "$admin_token" >"$tmp/admin-token"
chmod 600 "$tmp/admin-token"
export SYMPHONY_ADMIN_TOKEN="$admin_token"
"$bin" --port 0 --print-port --exit-on-stdin-eof --gpus 2 --model tc_model=0.268,5.172,200 --admin-token-file "$tmp/admin-token" <"$fifo" >>"$tmp/out" 2>>"$tmp/err" &
server=$!
exec 9>"$fifo"
cleanup() {
    exec 9>&- || true
    for _ in $(seq 50); do kill -0 "$server" 2>/dev/null || break; sleep 0.1; done
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT

port=""
for _ in $(seq 100); do
    port="$(sed -n 's/^PORT \([0-9]*\)$/\1/p' "$tmp/out")"
    [ -n "$port" ] && break
    kill -0 "$server" 2>/dev/null || { cat "$tmp/err"; exit 1; }
    sleep 0.1
done
[ -n "$port" ] || { echo "server did not report its port"; cat "$tmp/err"; exit 1; }
export SYMPHONY_URL="127.0.0.1:$port"
export SYMPHONY_GRPC_URL="127.0.0.1:$(sed -n 's/^GRPC_PORT \([0-9]*\)$/\1/p' "$tmp/out")"
export SYMPHONY_MODEL="${SYMPHONY_MODEL:-tc_model}"
# Its cluster model id (ResNet50 0, DenseNet121 1, tc_model 2): the
# reference output depends on it.
export SYMPHONY_MODEL_ID="${SYMPHONY_MODEL_ID:-2}"
echo "server at $SYMPHONY_URL"

if [ "$have_pytest" = 1 ]; then
    timeout 300 "$PY" -m pytest -q "$here/test_tritonclient.py" "$here/test_tritonclient_grpc.py"
else
    timeout 300 "$PY" "$here/test_tritonclient.py"
    timeout 300 "$PY" "$here/test_tritonclient_grpc.py"
fi

# The same server with TLS (the self-signed test certificate): tritonclient's SSL options over
# HTTP and gRPC. The certificate names localhost.
tls_dir="$here/../data/tls"
tls_fifo="$tmp/stdin-tls"
mkfifo "$tls_fifo"
"$bin" --port 0 --print-port --exit-on-stdin-eof --gpus 1 --models none --model tc_model=0.268,5.172,200 \
    --tls-cert "$tls_dir/cert.pem" --tls-key "$tls_dir/key.pem" <"$tls_fifo" >>"$tmp/out-tls" 2>>"$tmp/err-tls" &
tls_server=$!
exec 8>"$tls_fifo"
tls_port=""
for _ in $(seq 100); do
    tls_port="$(sed -n 's/^PORT \([0-9]*\)$/\1/p' "$tmp/out-tls")"
    [ -n "$tls_port" ] && break
    kill -0 "$tls_server" 2>/dev/null || { cat "$tmp/err-tls"; exit 1; }
    sleep 0.1
done
[ -n "$tls_port" ] || { echo "TLS server did not report its port"; cat "$tmp/err-tls"; exit 1; }
export SYMPHONY_TLS_URL="localhost:$tls_port"
export SYMPHONY_TLS_GRPC_URL="localhost:$(sed -n 's/^GRPC_PORT \([0-9]*\)$/\1/p' "$tmp/out-tls")"
# tc_model is model 0 of this server.
SYMPHONY_MODEL=tc_model SYMPHONY_MODEL_ID=0 timeout 120 "$PY" "$here/test_tritonclient_tls.py"
exec 8>&-
wait "$tls_server" 2>/dev/null || true

# perf_analyzer, when present (PyPI perf-analyzer ships a binary that needs
# the Triton C++ client libraries; see docs/_parts/frontend.md).
if [ "${RUN_PERF_ANALYZER:-0}" = 1 ] && command -v perf_analyzer >/dev/null; then
    timeout 120 perf_analyzer -m ResNet50 -u "$SYMPHONY_URL" -i http \
        --shape INPUT0:1,16 --measurement-interval 2000 --concurrency-range 1:4 || true
fi
