#!/usr/bin/env bash
# The GPU test machine's check (issue 51 item 3): one run of under five minutes that makes each
# of its rare minutes count. That machine has one H200, 16 cores, the CUDA 13 runtime, cuBLAS,
# cuDNN 9, NVRTC 13 and PyTorch 2.11 (cu130), but no network and no Rust toolchain: what it
# runs is built here and taken along, at most 64 MiB per run.
#
#   scripts/device-check.sh --prepare   (here) build with CI's release features, pack the bundle
#                                       into $BUNDLE (target/device-bundle): stripped binaries,
#                                       the GPU test binaries, the models, CPU reference outputs,
#                                       a MANIFEST; fails when the bundle is over 64 MiB
#   scripts/device-check.sh --dry-run   list every step with its command and every bundle file
#   scripts/device-check.sh --check     the bundle against its MANIFEST and the size limit
#   scripts/device-check.sh [--out DIR] (on the GPU machine, from the repository root, with
#                                       target/device-bundle carried) run the steps; every result
#                                       is a file in DIR (default $OUT, the device runner's folder)
#
# Steps (each bounded by its own timeout; all of them together by 295 s):
#   env   the machine: nvidia-smi, lscpu, the CUDA libraries found (SYMPHONY_CUDA_LIB_DIRS)
#   a     the GPU tests: backend's cuda, cuda_h2d, graph_cuda (ppocr_cls at batch 4 on the graph
#         engine against the same plan on the CPU), daemon (cuda) and lib (cuda_libs) test binaries
#         under CI=true; a capability skip of the gpu there is a failure (the GPU is the point)
#   b     the real models served on the GPU: `symphony up --model-repository` over ppocr_cls and
#         open_nsfw as KIND_GPU models (the backend runs them on the graph engine, issue 51), every
#         reference input sent over HTTP and every output checked against onnxruntime's CPU output
#         (1e-4 absolute + 1e-3 relative; b-serve.txt)
#   c     H2D bandwidth from the registered staging region against pageable memory and the PCIe
#         link's peak at the models' batch sizes (h2d.csv, h2d-link.txt)
#   d     both models' profiles on the GPU: `symphony profile` over the KIND_GPU repository (the
#         profiler runs a KIND_GPU model on the graph engine, GPU 0), 10 timed runs per batch size
#         (d-profile.json, d-profile.txt)
#   e     bench-cluster with a core per busy thread (pinned engine, --pin-cores) at 2 M tasks/s
#         for the lag targets (ingress and dispatch p99.9 <= 100 us)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
BUNDLE="${SYMPHONY_DEVICE_BUNDLE:-$root/target/device-bundle}"
LIMIT_MIB="${SYMPHONY_DEVICE_LIMIT_MIB:-64}"
FEATURES="--features dataplane/rdma,backend/cuda,tools/mutations"
MODELS=(ppocr_cls open_nsfw)
# The backend test binaries the GPU machine runs, by their test target name ("lib": the unit tests).
TESTS=(cuda cuda_h2d graph_cuda daemon lib)
# bench-cluster on 16 cores: the scheduler's 4 ModelThreads, its RankThread and I/O thread pinned
# on cores 2-7; the frontend and backend peer processes and the rest on the others.
BENCH=(bench-cluster --transport shm --rate 2000000 --gpus 1000 --engines pinned --model-threads 4
       --pin-cores "2,3,4,5,6,7" --duration-s 5 --json)
log() { echo "[device-check] $*" >&2; }
die() { log "$*"; exit 1; }

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

# --- the steps, as one table: NAME TIMEOUT_S DESCRIPTION (run_NAME runs it) -------------------
STEPS=(
  "env 20 the machine and the CUDA libraries found"
  "a 80 GPU tests: bundle/tests/{cuda,cuda_h2d,graph_cuda,daemon,lib} under CI=true, no gpu skip allowed"
  "b 30 ppocr_cls and open_nsfw as KIND_GPU models through bundle/bin/symphony up, outputs against bundle/reference"
  "c 40 H2D bandwidth: registered staging vs pageable vs link peak (bundle/tests/cuda_h2d)"
  "d 30 bundle/bin/symphony profile over the KIND_GPU repository (graph engine on GPU 0), 10 runs per batch size"
  "e 95 bundle/bin/symphony ${BENCH[*]}"
)

list_steps() {
  local s name t desc
  for s in "${STEPS[@]}"; do
    read -r name t desc <<<"$s"
    printf 'step %-4s timeout %3ss  %s\n' "$name" "$t" "$desc"
  done
}

# The files --prepare takes (source paths here), one per line: DEST SOURCE.
bundle_sources() {
  local rel="${CARGO_TARGET_DIR:-$root/target}/release"
  echo "bin/symphony $rel/symphony"
  echo "bin/symphony-backend $rel/symphony-backend"
  local t
  for t in "${TESTS[@]}"; do echo "tests/$t (the backend $t test binary)"; done
  local m
  for m in "${MODELS[@]}"; do
    echo "models/$m/1/model.onnx $root/models/$m/1/model.onnx"
    echo "models/$m/config.pbtxt $root/models/$m/config.pbtxt"
    echo "reference/$m/{input.bin,output.bin,meta.txt} (computed with onnxruntime on the CPU)"
  done
  echo "MANIFEST (bytes and sha256 of every file; the build's commit, root and date)"
}

dry_run() {
  echo "== steps (run on the GPU machine, results under \$OUT)"
  list_steps
  echo "== bundle: $BUNDLE (at most $LIMIT_MIB MiB)"
  if [ -f "$BUNDLE/MANIFEST" ]; then
    grep -v '^#' "$BUNDLE/MANIFEST" | awk '{printf "file %-40s %10d bytes\n", $3, $1}'
    echo "total $(du -sb "$BUNDLE" | cut -f1) bytes"
  else
    echo "(not prepared yet: --prepare packs these)"
    bundle_sources | sed 's/^/file /'
  fi
}

# --- --prepare ------------------------------------------------------------------------------
# The test binaries of the release build: `cargo test --no-run` prints
# "Executable tests/cuda.rs (target/release/deps/cuda-HASH)" for each, without the crate (the
# frontend has a tests/daemon.rs too), so the one taken is the one listing a test only the
# backend's has.
declare -A TEST_MARKER=([cuda]=without_a_driver_construction_reports_no_cuda_driver
  [cuda_h2d]=registered_staging_copies_faster_than_pageable_memory_on_a_gpu
  [graph_cuda]=a_kind_gpu_model_runs_on_the_graph_engine_or_setup_fails_cleanly
  [daemon]=cuda_executor_without_its_libraries_names_what_is_missing [lib]=exec::cuda_libs::tests::)
test_binary() {
  local name=$1 listing=$2 bin list
  if [ "$name" = lib ]; then
    grep -F 'Executable unittests src/lib.rs (' "$listing" | grep -F '/deps/backend-'
  else
    grep -F "Executable tests/$name.rs (" "$listing" | grep -F "/deps/$name-"
  fi | sed -E 's/.*\((.*)\)$/\1/' | while read -r bin; do
    # Listed whole first: grep -q would end the pipe early, and pipefail count the SIGPIPE.
    list="$("$bin" --list 2>/dev/null || true)"
    if grep -qF "${TEST_MARKER[$name]}" <<<"$list"; then echo "$bin"; break; fi
  done
}

references() {
  local py="$root/.venv/bin/python"
  [ -x "$py" ] || die "no $py: scripts/setup.sh makes the venv with onnxruntime (reference outputs)"
  local m
  for m in "${MODELS[@]}"; do
    mkdir -p "$BUNDLE/reference/$m"
    # Seeded inputs (4 samples), outputs from onnxruntime's CPU provider with one
    # thread (as scripts/onnx_reference.py); meta.txt: what the GPU engine's check needs.
    "$py" - "$root/models/$m/1/model.onnx" "$root/models/$m/config.pbtxt" "$BUNDLE/reference/$m" <<'PY'
import re, sys
import numpy as np
import onnxruntime as ort
model, config, out = sys.argv[1:4]
text = open(config).read()
max_batch = int(re.search(r"max_batch_size:\s*(\d+)", text).group(1))
# The input's dims from config.pbtxt: the graph may leave some symbolic.
dims = re.search(r"input \[ \{[^}]*dims: \[([^\]]*)\]", text).group(1)
so = ort.SessionOptions()
so.intra_op_num_threads = 1
so.inter_op_num_threads = 1
s = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
i, o = s.get_inputs()[0], s.get_outputs()[0]
# Four samples (or max_batch if fewer): step b sends each alone; more only fill the 64 MiB.
shape = [min(max_batch, 4)] + [int(d) for d in dims.split(",")]
x = np.random.default_rng(51).random(shape, dtype=np.float32)
y = s.run([o.name], {i.name: x})[0]
x.tofile(f"{out}/input.bin")
np.ascontiguousarray(y).tofile(f"{out}/output.bin")
with open(f"{out}/meta.txt", "w") as f:
    f.write(f"input {i.name} float32 {','.join(map(str, shape))}\n")
    f.write(f"output {o.name} float32 {','.join(map(str, y.shape))}\n")
    f.write(f"seed 51 uniform[0,1) onnxruntime {ort.__version__} CPUExecutionProvider 1 thread\n")
    f.write("tolerance 1e-4 absolute + 1e-3 relative (GPU kernels reorder sums)\n")
PY
  done
}

prepare() {
  local listing
  listing="$(mktemp)"
  trap 'rm -f "$listing"' RETURN
  log "building with CI's release features (reuses target/release when it is fresh)"
  # shellcheck disable=SC2086
  (cd "$root" && CARGO_PROFILE_RELEASE_DEBUG="${CARGO_PROFILE_RELEASE_DEBUG:-0}" \
     timeout 1800 cargo test --workspace --release $FEATURES --no-run) 2>"$listing" \
    || { cat "$listing" >&2; die "the release build failed"; }
  [ -f "$root/models/${MODELS[0]}/1/model.onnx" ] || bash "$root/scripts/fetch-models.sh"
  rm -rf "$BUNDLE"
  mkdir -p "$BUNDLE/bin" "$BUNDLE/tests"
  local rel="${CARGO_TARGET_DIR:-$root/target}/release" b t src m
  for b in symphony symphony-backend; do
    [ -x "$rel/$b" ] || die "no $rel/$b after the build"
    strip -o "$BUNDLE/bin/$b" "$rel/$b"
  done
  for t in "${TESTS[@]}"; do
    src="$(test_binary "$t" "$listing")"
    if [ -z "$src" ] || [ ! -x "$src" ]; then die "no test binary for backend's $t in the build's listing"; fi
    strip -o "$BUNDLE/tests/$t" "$src"
  done
  for m in "${MODELS[@]}"; do
    mkdir -p "$BUNDLE/models/$m/1"
    cp "$root/models/$m/1/model.onnx" "$BUNDLE/models/$m/1/"
    cp "$root/models/$m/config.pbtxt" "$BUNDLE/models/$m/"
  done
  references
  {
    echo "# bytes sha256 path; built $(date -u +%FT%TZ) at $root, commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "# build-root $root"
    (cd "$BUNDLE" && find . -type f ! -name MANIFEST | sort | while read -r f; do
       printf '%s %s %s\n' "$(stat -c %s "$f")" "$(sha256sum "$f" | cut -d' ' -f1)" "${f#./}"
     done)
  } >"$BUNDLE/MANIFEST"
  check_bundle
}

# The bundle against its MANIFEST (every file there, of its size and sha256) and the size limit.
check_bundle() {
  [ -f "$BUNDLE/MANIFEST" ] || die "no bundle at $BUNDLE (--prepare makes it)"
  local bytes sum path bad=0
  while read -r bytes sum path; do
    if [ ! -f "$BUNDLE/$path" ] || [ "$(stat -c %s "$BUNDLE/$path")" != "$bytes" ] \
       || [ "$(sha256sum "$BUNDLE/$path" | cut -d' ' -f1)" != "$sum" ]; then
      log "bundle file $path is missing or differs from MANIFEST"; bad=1
    fi
  done < <(grep -v '^#' "$BUNDLE/MANIFEST")
  [ "$bad" -eq 0 ] || die "the bundle does not match its MANIFEST"
  local total limit
  total=$(du -sb "$BUNDLE" | cut -f1)
  limit=$((LIMIT_MIB * 1024 * 1024))
  log "bundle $BUNDLE: $total bytes ($(( (total + 1048575) / 1048576 )) MiB of $LIMIT_MIB)"
  if [ "$total" -gt "$limit" ]; then
    du -ab "$BUNDLE" | sort -rn | head -8 >&2
    die "the bundle is $total bytes, over the $LIMIT_MIB MiB a device run takes along"
  fi
  echo "$BUNDLE $total"
}

# --- the run on the GPU machine --------------------------------------------------------------
# Folders holding the CUDA libraries: the driver's (ldconfig) and PyTorch's wheels' (NVRTC 13).
cuda_lib_dirs() {
  local dirs=() d
  d="$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 /{print $NF; exit}')"
  [ -n "$d" ] && dirs+=("$(dirname "$d")")
  while read -r d; do dirs+=("$(dirname "$d")"); done < <(
    python3 - <<'PY' 2>/dev/null || true
import glob, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()]
for r in roots:
    for p in sorted(glob.glob(f"{r}/nvidia/**/libnvrtc.so.1[23]", recursive=True)):
        print(p)
PY
  )
  local IFS=:
  echo "${dirs[*]}"
}

run_env() {
  { date -u; nvidia-smi || true; lscpu | grep -E 'Model name|^CPU\(s\)' || true
    echo "SYMPHONY_CUDA_LIB_DIRS=$SYMPHONY_CUDA_LIB_DIRS"; } >"$OUTDIR/env.txt" 2>&1
}

run_a() {
  local t rc=0
  for t in "${TESTS[@]}"; do
    local filter=()
    [ "$t" = daemon ] && filter=(cuda)
    [ "$t" = lib ] && filter=(cuda)
    CI=true SYMPHONY_DEVICE_OUT="$OUTDIR" SYMPHONY_SKIP_LOG="$OUTDIR/a-skips.log" \
      "$BUNDLE/tests/$t" "${filter[@]}" --test-threads 1 >"$OUTDIR/a-$t.log" 2>&1 || rc=1
  done
  if grep -q ' gpu\|gpu:' "$OUTDIR/a-skips.log" 2>/dev/null; then
    log "a GPU test skipped on the GPU machine (a-skips.log)"; rc=1
  fi
  return $rc
}

not_built() {
  echo "NOT RUN: $1" >"$OUTDIR/$2"
  return 2
}

# The bundle's models as KIND_GPU models behind `symphony up`; every reference sample sent alone
# over HTTP, its output against onnxruntime's (bundle/reference). Python's standard library only.
# The bundle's two models as KIND_GPU models in repository $1 (steps b and d).
gpu_repo() {
  local repo="$1" m
  mkdir -p "$repo"
  for m in ppocr_cls open_nsfw; do
    mkdir -p "$repo/$m/1"
    ln -sf "$BUNDLE/models/$m/1/model.onnx" "$repo/$m/1/model.onnx"
    sed -e 's/KIND_CPU/KIND_GPU/' -e 's/string_value: "20"/string_value: "500"/' \
      "$BUNDLE/models/$m/config.pbtxt" >"$repo/$m/config.pbtxt"
  done
}

run_b() {
  local repo="$OUTDIR/b-repo" up url="" rc=0
  gpu_repo "$repo"
  # Generous profiles: this step checks outputs, not timing.
  cat >"$repo/profile.json" <<'EOF'
{"models": [
 {"name": "open_nsfw", "alpha_ms": 30.0, "beta_ms": 100.0, "r2": 1, "worst_residual_ms": 0, "memory_static_bytes": 0, "memory_peak_bytes": 0, "latency_ms": []},
 {"name": "ppocr_cls", "alpha_ms": 2.0, "beta_ms": 50.0, "r2": 1, "worst_residual_ms": 0, "memory_static_bytes": 0, "memory_peak_bytes": 0, "latency_ms": []}
]}
EOF
  "$BUNDLE/bin/symphony" up --model-repository "$repo" --frontends 1 --backends 1 \
    >"$OUTDIR/b-up.out" 2>"$OUTDIR/b-up.err" &
  up=$!
  for _ in $(seq 200); do
    url="$(sed -n 's|^frontend 1: http://\([0-9.:]*\)$|\1|p' "$OUTDIR/b-up.out")"
    [ -n "$url" ] && break
    kill -0 "$up" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$url" ]; then
    echo "FAIL symphony up did not serve (b-up.err)" >"$OUTDIR/b-serve.txt"
    kill -INT "$up" 2>/dev/null || true
    return 1
  fi
  python3 - "$url" "$BUNDLE" >"$OUTDIR/b-serve.txt" 2>&1 <<'PY' || rc=1
import array, json, re, sys, urllib.request
url, bundle = sys.argv[1:3]
bad = 0
for m, out_name in (("ppocr_cls", None), ("open_nsfw", None)):
    meta = dict(l.split(" ", 1) for l in open(f"{bundle}/reference/{m}/meta.txt").read().splitlines())
    in_name, _, in_shape = meta["input"].split()[:3]
    out_name = re.search(r'output \[ \{ name: "([^"]+)"', open(f"{bundle}/models/{m}/config.pbtxt").read()).group(1)
    shape = [int(d) for d in in_shape.split(",")]
    x, y = array.array("f"), array.array("f")
    x.frombytes(open(f"{bundle}/reference/{m}/input.bin", "rb").read())
    y.frombytes(open(f"{bundle}/reference/{m}/output.bin", "rb").read())
    per_in, per_out = len(x) // shape[0], len(y) // shape[0]
    for i in range(shape[0]):
        raw = x[i * per_in:(i + 1) * per_in].tobytes()
        hdr = json.dumps({"inputs": [{"name": in_name, "datatype": "FP32", "shape": [1] + shape[1:],
                                      "parameters": {"binary_data_size": len(raw)}}],
                          "outputs": [{"name": out_name, "parameters": {"binary_data": False}}]}).encode()
        req = urllib.request.Request(f"http://{url}/v2/models/{m}/infer", data=hdr + raw, headers={
            "Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(hdr))})
        try:
            with urllib.request.urlopen(req, timeout=20) as r:
                got = json.loads(r.read())["outputs"][0]["data"]
        except Exception as e:
            print(f"FAIL {m} sample {i}: {e}")
            bad += 1
            continue
        want = list(y[i * per_out:(i + 1) * per_out])
        ok = len(got) == len(want) and all(abs(g - w) <= 1e-4 + 1e-3 * abs(w) for g, w in zip(got, want))
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {m} sample {i}: GPU {got} onnxruntime(CPU) {want}")
print(f"{'all outputs match' if bad == 0 else f'{bad} outputs differ'} (1e-4 absolute + 1e-3 relative)")
sys.exit(1 if bad else 0)
PY
  kill -INT "$up" 2>/dev/null || true
  wait "$up" || true
  return $rc
}
run_d() {
  local repo="$OUTDIR/d-repo"
  gpu_repo "$repo"
  "$BUNDLE/bin/symphony" profile --model-repository "$repo" --runs 10 --out "$OUTDIR/d-profile.json" \
    >"$OUTDIR/d-profile.txt" 2>&1
}

run_c() {
  SYMPHONY_DEVICE_OUT="$OUTDIR" CI=true "$BUNDLE/tests/cuda_h2d" --test-threads 1 --nocapture \
    >"$OUTDIR/c-h2d.log" 2>&1 && [ -s "$OUTDIR/h2d.csv" ]
}

run_e() {
  "$BUNDLE/bin/symphony" "${BENCH[@]}" >"$OUTDIR/e-bench-cluster.json" 2>"$OUTDIR/e-bench-cluster.log"
}

run_all() {
  check_bundle >/dev/null
  mkdir -p "$OUTDIR"
  # The daemon test runs the backend binary at the path it was built at: make that path exist.
  local built
  built="$(awk '/^# build-root /{print $3}' "$BUNDLE/MANIFEST")"
  if [ -n "$built" ] && [ ! -x "$built/target/release/symphony-backend" ]; then
    mkdir -p "$built/target/release"
    ln -sf "$BUNDLE/bin/symphony-backend" "$built/target/release/symphony-backend"
  fi
  SYMPHONY_CUDA_LIB_DIRS="${SYMPHONY_CUDA_LIB_DIRS:-$(cuda_lib_dirs)}"
  export SYMPHONY_CUDA_LIB_DIRS
  local s name t desc rc start fails=0
  start=$(date +%s)
  : >"$OUTDIR/summary.txt"
  for s in "${STEPS[@]}"; do
    read -r name t desc <<<"$s"
    local t0=$SECONDS
    log "step $name: $desc"
    rc=0
    # Each step in a subshell under its own timeout: one stuck step costs only its budget.
    timeout -k 5 "$t" bash -c "$(declare -f run_"$name" not_built log gpu_repo); $(declare -p OUTDIR BUNDLE BENCH TESTS); run_$name" || rc=$?
    local verdict=ok
    case $rc in 0) ;; 2) verdict="not run" ;; 124|137) verdict="timed out"; fails=$((fails + 1)) ;; *) verdict="failed ($rc)"; fails=$((fails + 1)) ;; esac
    printf '%-4s %-10s %4ss  %s\n' "$name" "$verdict" "$((SECONDS - t0))" "$desc" | tee -a "$OUTDIR/summary.txt" >&2
  done
  echo "total $(( $(date +%s) - start )) s, $fails failed" | tee -a "$OUTDIR/summary.txt" >&2
  [ "$fails" -eq 0 ]
}

OUTDIR="${OUT:-$root/target/device-out}"
case "${1:-}" in
  --prepare) prepare ;;
  --dry-run) dry_run ;;
  --check) check_bundle ;;
  --out) OUTDIR="${2:?--out DIR}"; run_all ;;
  "") run_all ;;
  -h|--help) usage ;;
  *) usage >&2; exit 2 ;;
esac
