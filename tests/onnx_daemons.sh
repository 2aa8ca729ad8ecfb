#!/usr/bin/env bash
# Real models end to end through the real daemons: `symphony up --model-repository` over a
# repository holding the fetched ppocr_cls and open_nsfw (scripts/fetch-models.sh) and a broken
# model (its config.pbtxt declares 4 input channels, the graph has 3), then
# tests/python/onnx_e2e.py: outputs equal Python onnxruntime's within 1e-5; wrong shape, datatype,
# byte size, unknown model or version get 4xx naming the problem; the broken model gets a 5xx
# and nothing else is affected; the frontend's accounting stays exact. Then Ctrl-C and a clean
# exit. Bounded in time; leaves no process behind.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
PY="$root/.venv/bin/python"
. "$root/tests/lib/require.sh"
# ONNX Runtime is installable anywhere (scripts/setup.sh): under CI its absence is a failure.
require tests/onnx_daemons.sh onnx-runtime \
    "the onnxruntime and numpy wheels in $root/.venv (scripts/setup.sh installs them)" \
    "$PY" -c "import onnxruntime, numpy" || exit 0
# The daemons load ONNX Runtime's library themselves: an override that names nothing is missing too.
require tests/onnx_daemons.sh onnx-runtime \
    "ONNX Runtime's library: SYMPHONY_ORT_DYLIB=${SYMPHONY_ORT_DYLIB:-} is not a file" \
    test -z "${SYMPHONY_ORT_DYLIB:-}" -o -f "${SYMPHONY_ORT_DYLIB:-}" || exit 0
bash "$root/scripts/fetch-models.sh"
# RELEASE_BUILD (tests/run.sh): its test step's build command, a no-op here.
# shellcheck disable=SC2086
(cd "$root" && timeout 900 ${RELEASE_BUILD:-cargo build --release -p tools --bin symphony} -q)
bin="$CARGO_TARGET_DIR/release/symphony"
tmp="$(mktemp -d)"
repo="$tmp/repo"
for m in ppocr_cls open_nsfw; do
    mkdir -p "$repo/$m/1"
    ln -s "$root/models/$m/1/model.onnx" "$repo/$m/1/model.onnx"
    cp "$root/models/$m/config.pbtxt" "$repo/$m/"
done
mkdir -p "$repo/broken/1"
ln -s "$root/models/ppocr_cls/1/model.onnx" "$repo/broken/1/model.onnx"
sed -e 's/"ppocr_cls"/"broken"/' -e 's/dims: \[ 3, 48, 192 \]/dims: [ 4, 48, 192 ]/' \
    "$root/models/ppocr_cls/config.pbtxt" > "$repo/broken/config.pbtxt"
# Profiles by hand, generous: this test checks serving, not timing. Each request here comes
# alone, and deferred scheduling holds a lone request to its latest start (deadline - l(1)), so
# it is answered late by however much the run exceeds l(1); over the 100 ms grace it times out.
# Measured warm on this VM: ppocr_cls 1-2 ms, open_nsfw 20-25 ms at batch 1; these profiles say
# 52 and 130 ms (and still fit a full batch in the SLO: 82 of 500 ms, 340 of 1000 ms).
cat > "$repo/profile.json" <<'EOF'
{"models": [
 {"name": "broken", "alpha_ms": 1.0, "beta_ms": 1.0, "r2": 1, "worst_residual_ms": 0, "memory_static_bytes": 0, "memory_peak_bytes": 0, "latency_ms": []},
 {"name": "open_nsfw", "alpha_ms": 30.0, "beta_ms": 100.0, "r2": 1, "worst_residual_ms": 0, "memory_static_bytes": 0, "memory_peak_bytes": 0, "latency_ms": []},
 {"name": "ppocr_cls", "alpha_ms": 2.0, "beta_ms": 50.0, "r2": 1, "worst_residual_ms": 0, "memory_static_bytes": 0, "memory_peak_bytes": 0, "latency_ms": []}
]}
EOF
sed -i 's/string_value: "20"/string_value: "500"/' "$repo/ppocr_cls/config.pbtxt"
sed -i 's/string_value: "20"/string_value: "500"/' "$repo/broken/config.pbtxt"
. "$root/tests/lib/up_serve.sh"
up_serve "$tmp" --model-repository "$repo" --frontends 1 --backends 1
echo "daemons up with real models; frontend 1 at $url"
timeout 300 "$PY" "$root/tests/python/onnx_e2e.py" "$url" "$root/models"
up_stop
echo "real models through the daemons: ok; clean shutdown"
