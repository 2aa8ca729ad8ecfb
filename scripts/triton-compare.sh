#!/usr/bin/env bash
# Symphony against NVIDIA Triton 2.51 on EQUAL resources, from a clone (issue 54):
#   bash scripts/triton-compare.sh [--quick] [--json] [--out DIR] [--cases LIST] [--protocols LIST]
#   bash scripts/triton-compare.sh --pa-sweep [--quick] [--out DIR]
# Cases (LIST is comma-separated; default all in full mode):
#   ppocr_cls:1  ppocr_cls:2  open_nsfw:1  open_nsfw:2   one model, 1 or 2 model instances
#   multi:2     both models on 2 instances in all, popularity 90/10 that flips to 10/90 halfway
# Equal resources: Triton runs the model with instance_group count N (multi: one instance per
# model, Triton cannot share an instance between models), each instance ONNX Runtime with 1
# intra-op thread; Symphony runs `symphony up --model-repository` with 1 frontend and N
# backends, each serving every model of the case with 1 intra-op thread. Both are on the same
# cores as the client (the machine is what it is: the script prints nproc and the load).
# SLO: each model's own (parameters slo_ms of its config.pbtxt, from scripts/fetch-models.sh).
# Load: scripts/triton_loadgen.py, an open-loop Poisson ladder (the same client for both
#   servers) that counts failed, late, wrong and skipped requests as misses and checks every
#   answer against ONNX Runtime's output for the input sent; goodput = the highest rate of the
#   ladder with <= 1% misses (the ladder stops after two bad rates in a row). The ladder is
#   fractions of a capacity estimate from the models' profiles (symphony profile), so its first
#   rung (5%) is the light-load point whose p99 both servers are compared at.
# Triton's dynamic batcher is tuned over max_queue_delay_microseconds x preferred_batch_size
#   (full: 0/500/2000 us x none/[4,8]; quick: 0/2000 us, no preferred sizes); its best goodput
#   counts. Symphony runs its defaults (no tuning).
# Closed loop (full mode): perf_analyzer at concurrency 1, 4, 16 for both, HTTP.
# CPU per inference: user+system time of each server's process tree (/proc) over a rung,
#   divided by the answers in it; reported at the goodput rung.
# Server-side split (Symphony only, from the metrics endpoints `up` prints): per rung, each
#   stage's mean per executed request (network, queue, input, compute, output), the mean
#   batch, late starts and the scheduler's dispatch lag; in the JSON as server_stages.
# Output: DIR/summary.md (+ DIR/*.jsonl, one line per rung); with --json one JSON object on
#   stdout, with "goodput_ratio" (Symphony / Triton's best) per case.
# --pa-sweep: instead of the cases, does perf_analyzer (default settings, HTTP, 1 instance)
#   complete against each server at every concurrency 1..32 (quick: 1 2 4 8 16 24 32) and every
#   rate of the model's ladder (Poisson request-rate mode), for ppocr_cls and open_nsfw (env
#   PA_MODELS)? One row per point: done, aborted (perf_analyzer ends a measurement at the first
#   failed request, with its error line) or no result (no stable measurement: host noise; the
#   stability bound is PA_STABILITY %, default 1000; PA_SERVERS="ours" skips Triton). Ours serves late answers by default, so what
#   misses its SLO is answered late, as Triton does (a dropped try, or a batch the scheduler gave
#   up, is sent again); each of our rows says what was resent, failed back or refused during it.
#   Output DIR/pa-sweep.md.
# --quick: ppocr_cls:1, open_nsfw:1 and multi:2 over HTTP, 2.5 s rungs, Triton tuned on the
#   first case only: under 5 minutes once installed and built.
# Installs (cached in target/triton-ref, TRITON_DIR): the reference Triton of
#   ../shared/tools/triton-reference.sh (nvidia-pytriton 0.7.0's tritonserver with its python
#   backend running onnxruntime 1.31.1, the version our ort crate loads), tritonclient 2.41.1's
#   perf_analyzer, grpcio and aiohttp for the load generator. Env: SYMPHONY_BIN (skip the build),
#   RELEASE_BUILD (the build command), STEP_S (seconds per rung), TRITON_DIR.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
quick=0 json=0 pa_sweep=0 out="$root/target/triton-compare" cases="" protocols=""
while [ $# -gt 0 ]; do
  case $1 in
    --quick) quick=1 ;; --json) json=1 ;; --pa-sweep) pa_sweep=1 ;;
    --out) out=$2; shift ;; --cases) cases=$2; shift ;; --protocols) protocols=$2; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac; shift
done
if [ "$quick" = 1 ]; then
  cases=${cases:-ppocr_cls:1,open_nsfw:1,multi:2} protocols=${protocols:-http}
  step_s=${STEP_S:-2.5} fracs="0.05 0.15 0.3 0.5 0.75 1.0 1.5 2.0" delays="0 2000" prefs="none" refine=2
else
  cases=${cases:-ppocr_cls:1,ppocr_cls:2,open_nsfw:1,open_nsfw:2,multi:2} protocols=${protocols:-http,grpc}
  step_s=${STEP_S:-8} fracs="0.05 0.1 0.2 0.3 0.4 0.5 0.6 0.7 0.8 0.9 1.0 1.2 1.5 2.0" delays="0 500 2000" prefs="none 4,8" refine=3
fi
tdir="${TRITON_DIR:-$root/target/triton-ref}"
venv=$tdir/venv py=$tdir/venv/bin/python
mkdir -p "$out"
log() { echo "[triton-compare] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
t_start=$SECONDS

# ---------------------------------------------------------------- install (idempotent)
PINS=(numpy==1.26.4 onnxruntime==1.31.1 "tritonclient[grpc]==2.41.1" nvidia-cuda-runtime-cu12==12.6.77 aiohttp==3.13.2)
PYTRITON=nvidia-pytriton==0.7.0   # --no-deps: only its bundled tritonserver + python backend
apt_install() {
  local missing=() p sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "apt-get install ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
setup_triton() {
  local pyver site
  apt_install python3 python3-venv libb64-0d curl
  pyver=$(/usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  ldconfig -p | grep -q "libpython$pyver.so.1.0" || apt_install "libpython$pyver"
  mkdir -p "$tdir"
  [ -x "$py" ] || /usr/bin/python3 -m venv "$venv"
  if [ "$(cat "$venv/.pins" 2>/dev/null)" != "${PINS[*]} $PYTRITON" ]; then
    log "pip install ${PINS[*]} $PYTRITON (PyPI, ~150 MB)"
    "$venv/bin/pip" install -q --disable-pip-version-check "${PINS[@]}"
    "$venv/bin/pip" install -q --disable-pip-version-check --no-deps "$PYTRITON"
    echo "${PINS[*]} $PYTRITON" > "$venv/.pins"
  fi
  site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  ts=$site/pytriton/tritonserver cudart=$site/nvidia/cuda_runtime/lib
  [ -f "$ts/python_backend_stubs/$pyver/triton_python_backend_stub" ] || die "no python backend stub for Python $pyver"
  install -m 755 "$ts/python_backend_stubs/$pyver/triton_python_backend_stub" "$ts/backends/python/"
}

# ---------------------------------------------------------------- models, profile, binary
setup_triton
bash "$root/scripts/fetch-models.sh" >&2
if [ -n "${SYMPHONY_BIN:-}" ]; then sym=$SYMPHONY_BIN; else
  # shellcheck disable=SC2086
  (cd "$root" && ${RELEASE_BUILD:-cargo build -q --release -p tools --bin symphony} >&2)
  sym="${CARGO_TARGET_DIR:-$root/target}/release/symphony"
fi
[ -x "$sym" ] || die "no symphony binary at $sym"
all_models="ppocr_cls open_nsfw"
if [ ! -s "$out/profile.json" ]; then
  log "symphony profile (once; cached in $out/profile.json)"
  "$sym" profile --model-repository "$root/models" --runs 20 --out "$out/profile.json" > "$out/profile.txt"
fi
[ -s "$out/reference.npz" ] || "$py" "$root/scripts/triton_loadgen.py" reference --repository "$root/models" \
  --models "${all_models// /,}" --out "$out/reference.npz"
slo_of() { sed -n 's/.*key: "slo_ms" value { string_value: "\([0-9.]*\)".*/\1/p' "$root/models/$1/config.pbtxt"; }
maxb_of() { sed -n 's/^max_batch_size: \([0-9]*\)/\1/p' "$root/models/$1/config.pbtxt"; }
# capacity estimate, requests/s: N instances x the profile's best samples/s over batch sizes
# up to max_batch_size whose latency fits the SLO (l(b) = alpha b + beta)
cap_of() {  # cap_of MODEL INSTANCES
  "$py" - "$out/profile.json" "$1" "$2" "$(maxb_of "$1")" "$(slo_of "$1")" <<'EOF'
import json, sys
prof, name, n, maxb, slo = json.load(open(sys.argv[1])), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
models = prof["models"] if isinstance(prof.get("models"), list) else [dict(name=k, **v) for k, v in prof.get("models", prof).items()]
m = next(x for x in models if x["name"] == name)
a, b = m["alpha_ms"], m["beta_ms"]
print(round(n * max(k / (a * k + b) for k in range(1, maxb + 1) if a * k + b <= slo / 2 or k == 1) * 1e3, 1))
EOF
}

# ---------------------------------------------------------------- servers
free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
srv_pid="" srv_kind="" metrics_urls=()
stop_server() {
  [ -n "$srv_pid" ] || return 0
  if [ "$srv_kind" = ours ]; then kill -INT "$srv_pid" 2>/dev/null || true; else kill "$srv_pid" 2>/dev/null || true; fi
  for _ in $(seq 100); do kill -0 "$srv_pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$srv_pid" 2>/dev/null || true
  wait "$srv_pid" 2>/dev/null || true
  srv_pid=""
}
trap stop_server EXIT
MODEL_PY='import json, os
import numpy as np, onnxruntime as ort
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        so = ort.SessionOptions()
        so.intra_op_num_threads = int(cfg["parameters"]["ort_intra_op_threads"]["string_value"])
        so.inter_op_num_threads = 1
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        self.sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        self.inp, self.out = self.sess.get_inputs()[0].name, self.sess.get_outputs()[0].name

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, self.inp).as_numpy() for r in requests]
        y = self.sess.run([self.out], {self.inp: xs[0] if len(xs) == 1 else np.concatenate(xs)})[0]
        parts = np.split(y, np.cumsum([len(x) for x in xs])[:-1])
        return [pb_utils.InferenceResponse([pb_utils.Tensor(self.out, p)]) for p in parts]'
# start_triton DELAY_US PREF INSTANCES_PER_MODEL MODEL...: sets srv_pid, http_url, grpc_url
start_triton() {
  local delay=$1 pref=$2 n=$3 repo="$out/triton-repo" m dyn metrics; shift 3
  rm -rf "$repo"
  for m in "$@"; do
    mkdir -p "$repo/$m/1"
    ln -s "$root/models/$m/1/model.onnx" "$repo/$m/1/model.onnx"
    printf '%s\n' "$MODEL_PY" > "$repo/$m/1/model.py"
    dyn="max_queue_delay_microseconds: $delay"
    [ "$pref" = none ] || dyn="preferred_batch_size: [ $pref ], $dyn"
    grep -v -e '^platform:' -e '^dynamic_batching' -e '^instance_group' "$root/models/$m/config.pbtxt" > "$repo/$m/config.pbtxt"
    cat >> "$repo/$m/config.pbtxt" <<EOF
backend: "python"
dynamic_batching { $dyn }
instance_group [ { count: $n, kind: KIND_CPU } ]
parameters { key: "ort_intra_op_threads" value { string_value: "1" } }
EOF
  done
  local hp gp; hp=$(free_port) gp=$(free_port) metrics=$(free_port)
  PATH="$venv/bin:$PATH" "$ts/bin/tritonserver" --model-repository "$repo" \
    --backend-directory "$ts/backends" --cache-directory "$ts/caches" \
    --http-address 127.0.0.1 --http-port "$hp" --grpc-address 127.0.0.1 --grpc-port "$gp" \
    --metrics-address 127.0.0.1 --metrics-port "$metrics" > "$out/triton.log" 2>&1 < /dev/null &
  srv_pid=$! srv_kind=triton metrics_urls=() http_url=127.0.0.1:$hp grpc_url=127.0.0.1:$gp
  for _ in $(seq 600); do
    curl -sf -o /dev/null "http://$http_url/v2/health/ready" && return 0
    kill -0 "$srv_pid" 2>/dev/null || { tail -n 20 "$out/triton.log" >&2; die "tritonserver exited"; }
    sleep 0.2
  done
  die "tritonserver not ready after 120 s ($out/triton.log)"
}
# start_ours BACKENDS MODEL...: the models' own config.pbtxt (SLO), 1 frontend, N backends
start_ours() {
  local n=$1 repo="$out/ours-repo" m; shift
  rm -rf "$repo"; mkdir -p "$repo"
  for m in "$@"; do
    mkdir -p "$repo/$m/1"
    ln -s "$root/models/$m/1/model.onnx" "$repo/$m/1/model.onnx"
    cp "$root/models/$m/config.pbtxt" "$repo/$m/config.pbtxt"
  done
  cp "$out/profile.json" "$repo/profile.json"
  : > "$out/ours.out"; : > "$out/ours.err"
  "$sym" up --model-repository "$repo" --frontends 1 --backends "$n" --serve >> "$out/ours.out" 2>> "$out/ours.err" &
  srv_pid=$! srv_kind=ours
  for _ in $(seq 1200); do
    http_url="$(sed -n 's|^frontend 1: http://\([0-9.:]*\)$|\1|p' "$out/ours.out")"
    grpc_url="$(sed -n 's|^frontend 1 grpc: \([0-9.:]*\)$|\1|p' "$out/ours.out")"
    if [ -n "$http_url" ] && [ -n "$grpc_url" ]; then
      # every metrics endpoint up printed: the ladder's server-side split (stage means per rung)
      mapfile -t metrics_urls < <(sed -n 's|^.* metrics: \(http://[0-9.:]*/metrics\)$|\1|p' "$out/ours.out")
      return 0
    fi
    kill -0 "$srv_pid" 2>/dev/null || { tail -n 20 "$out/ours.err" >&2; die "symphony up exited"; }
    sleep 0.1
  done
  die "symphony up did not print its addresses ($out/ours.err)"
}

# ladder LABEL PROTOCOL MIX SLOS RATES: runs the open-loop ladder on the running server;
# appends its rungs to $out/LABEL.jsonl, echoes the goodput
ladder() {
  local label=$1 proto=$2 url=$http_url m margs=()
  [ "$proto" = grpc ] && url=$grpc_url
  for m in "${metrics_urls[@]}"; do margs+=(--metrics "$m"); done
  "$py" "$root/scripts/triton_loadgen.py" ladder --url "$url" --protocol "$proto" \
    --reference "$out/reference.npz" --mix "$3" --slo-ms "$4" --rates "$5" --duration "$step_s" \
    --refine "$refine" --server-pid "$srv_pid" "${margs[@]}" > "$out/$label.jsonl" 2> "$out/$label.err" || { cat "$out/$label.err" >&2; die "load generator failed ($label)"; }
  "$py" -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])["goodput_rps"])' "$out/$label.jsonl"
}
closed_loop() {  # closed_loop LABEL MODEL: perf_analyzer HTTP at concurrency 1, 4, 16 (or "failed")
  LD_LIBRARY_PATH="$cudart${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout 120 "$venv/bin/perf_analyzer" \
    -m "$2" -u "$http_url" -i http -b 1 --concurrency-range 1:16:4 --measurement-interval 3000 \
    --stability-percentage 50 --max-trials 5 -f "$out/$1-pa.csv" > "$out/$1-pa.log" 2>&1 || echo "failed" > "$out/$1-pa.failed"
}

# ---------------------------------------------------------------- perf_analyzer sweep
# pa_point LABEL MODEL ARGS...: one perf_analyzer measurement; prints "done IPS P99_MS" or
# "aborted: FIRST ERROR LINE"
pa_point() {
  local label=$1 model=$2; shift 2
  if LD_LIBRARY_PATH="$cudart${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout 90 "$venv/bin/perf_analyzer" \
    -m "$model" -u "$http_url" -i http -b 1 --measurement-interval 2000 --stability-percentage "$pa_stability" \
    --max-trials 3 -f "$out/pa-$label.csv" "$@" > "$out/pa-$label.log" 2>&1 && [ -s "$out/pa-$label.csv" ]; then
    awk -F, 'NR==1{for(i=1;i<=NF;i++)c[$i]=i;next} NR==2{printf "done %.0f/s p99 %.2f ms\n", $c["Inferences/Second"], $c["p99 latency"]/1000}' "$out/pa-$label.csv"
  elif grep -q "had error" "$out/pa-$label.log"; then
    # a failed request: perf_analyzer ends the measurement at the first one
    echo "aborted: $(grep -m1 "had error" "$out/pa-$label.log" | cut -c1-160)"
  else
    # no stable measurement within its trials (a noisy host), or anything else
    echo "no result: $(grep -m1 -i -e "failed to obtain" -e "error" "$out/pa-$label.log" | cut -c1-120)"
  fi
}
# sym_counters: our servers' counters summed over the metrics endpoints `up` printed:
# "DEADLINE ABANDONED INPUT FAILED_BACK PROTOCOL_ERRORS" (resends by cause, the scheduler's
# tasks failed back, reports it refused, e.g. a BatchDone after its batch was given up)
sym_counters() {
  local u all=""
  for u in "${metrics_urls[@]}"; do all+="$(curl -sf --max-time 2 "$u" || true)"$'\n'; done
  awk '/^symphony_late_resends_total\{/ { split($0, a, "cause=\""); split(a[2], b, "\""); r[b[1]] += $NF }
       /^symphony_tasks_failed_back_total / { fb += $NF } /^symphony_protocol_errors_total / { pe += $NF }
       END { printf "%d %d %d %d %d", r["deadline"], r["abandoned"], r["input_unavailable"], fb, pe }' <<< "$all"
}
# sym_delta BEFORE AFTER: what the counters of sym_counters moved by during a point (empty if nothing)
sym_delta() {
  awk -v a="$1" -v b="$2" 'BEGIN { split(a, x, " "); split(b, y, " "); n = split("deadline abandoned input_unavailable", k, " ")
    for (i = 1; i <= n; i++) if (y[i] - x[i] > 0) s = s sprintf("%s%d %s", s == "" ? "" : ", ", y[i] - x[i], k[i])
    if (s != "") s = "resent " s; if (y[4] - x[4] > 0) s = s sprintf("%sfailed back %d", s == "" ? "" : "; ", y[4] - x[4])
    if (y[5] - x[5] > 0) s = s sprintf("%sprotocol errors %d", s == "" ? "" : "; ", y[5] - x[5]); if (s != "") print " (" s ")" }'
}
if [ "$pa_sweep" = 1 ]; then
  if [ "$quick" = 1 ]; then concs="1 2 4 8 16 24 32"; else concs=$(seq 1 32); fi
  pa_models=${PA_MODELS:-ppocr_cls open_nsfw}
  # max/min of the last 3 windows within this many % (perf_analyzer's default is 10): on a shared
  # host neither server is ever that steady, and the question is whether it completes
  pa_stability=${PA_STABILITY:-1000}
  {
    echo "# perf_analyzer 2.41.1 (HTTP, 1 instance; 2 s windows, 3 trials, stability $pa_stability %) against both servers"
    echo "machine: $(nproc) cores ($(lscpu | sed -n 's/^Model name: *//p')), load avg $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%Y-%m-%dT%H:%MZ)"
  } > "$out/pa-sweep.md"
  declare -A res
  for m in $pa_models; do
    cap=$(cap_of "$m" 1)
    prates=$(for f in $fracs; do awk -v c="$cap" -v f="$f" 'BEGIN{r = c * f; printf "%s ", (r < 10 ? sprintf("%.1f", r) : sprintf("%d", r))}'; done)
    for who in ${PA_SERVERS:-ours triton}; do
      if [ "$who" = ours ]; then start_ours 1 "$m"; else start_triton 0 none 1 "$m"; fi
      # each point's row; for ours, with what the server resent or failed back meanwhile
      point() {  # point KEY ARGS...
        local key=$1 before=""; shift
        [ "$who" = ours ] && before=$(sym_counters)
        res[$key]=$(pa_point "$who-$m-${key##*-}" "$m" "$@")
        [ "$who" = ours ] && res[$key]+=$(sym_delta "$before" "$(sym_counters)")
        log "$m $who ${key##*-}: ${res[$key]}"
      }
      for c in $concs; do point "$m-$who-c$c" --concurrency-range "$c"; done
      for r in $prates; do point "$m-$who-r$r" --request-rate-range "$r:$r:1" --request-distribution poisson; done
      stop_server
    done
    {
      echo; echo "## $m (SLO $(slo_of "$m") ms, capacity estimate $cap req/s)"; echo
      echo "| point | Symphony | Triton (delay 0 us) |"; echo "|---|---|---|"
      for c in $concs; do echo "| concurrency $c | ${res[$m-ours-c$c]:-not run} | ${res[$m-triton-c$c]:-not run} |"; done
      for r in $prates; do echo "| Poisson $r req/s | ${res[$m-ours-r$r]:-not run} | ${res[$m-triton-r$r]:-not run} |"; done
    } >> "$out/pa-sweep.md"
  done
  cat "$out/pa-sweep.md"
  exit 0
fi

# ---------------------------------------------------------------- cases
results="$out/results.jsonl"; : > "$results"
best_triton_cfg=""
log "machine: $(nproc) cores ($(lscpu | sed -n 's/^Model name: *//p')), load avg $(cut -d' ' -f1-3 /proc/loadavg)"
IFS=, read -r -a case_list <<< "$cases"
IFS=, read -r -a proto_list <<< "$protocols"
for c in "${case_list[@]}"; do
  name=${c%%:*} n=${c##*:}
  if [ "$name" = multi ]; then
    models="ppocr_cls open_nsfw" per_model=$(( n / 2 > 0 ? n / 2 : 1 ))
    # open_nsfw is the bottleneck; capacity in requests/s of the 90/10 mix of either phase
    c1=$(cap_of ppocr_cls "$per_model") c2=$(cap_of open_nsfw "$per_model")
    cap=$(awk -v a="$c1" -v b="$c2" 'BEGIN{x = 1/(0.9/a + 0.1/b); y = 1/(0.1/a + 0.9/b); printf "%.1f", (x < y ? x : y)}')
    mix="ppocr_cls=0.9,open_nsfw=0.1;ppocr_cls=0.1,open_nsfw=0.9"
  else
    models=$name per_model=$n cap=$(cap_of "$name" "$n") mix="$name=1"
  fi
  slos=$(for m in $models; do printf '%s=%s,' "$m" "$(slo_of "$m")"; done); slos=${slos%,}
  rates=$(for f in $fracs; do awk -v c="$cap" -v f="$f" 'BEGIN{r = c * f; printf "%s ", (r < 10 ? sprintf("%.1f", r) : sprintf("%d", r))}'; done)
  # shellcheck disable=SC2086
  set -- $models
  for proto in "${proto_list[@]}"; do
    tag="$name-$n-$proto"
    log "case $tag: capacity estimate $cap req/s, ladder $rates(x ${step_s} s), SLO $slos"
    # Symphony first, then Triton's configurations (alternating per case)
    start_ours "$n" "$@"
    g_ours=$(ladder "ours-$tag" "$proto" "$mix" "$slos" "$rates")
    [ "$quick" = 1 ] || [ "$proto" != http ] || closed_loop "ours-$tag" "$1"
    stop_server
    log "  symphony: goodput $g_ours req/s"
    g_tri=0 cfg_tri=""
    tri_cfgs=()
    if [ "$quick" = 1 ] && [ -n "$best_triton_cfg" ]; then tri_cfgs=("$best_triton_cfg"); else
      for d in $delays; do for p in $prefs; do tri_cfgs+=("$d/$p"); done; done
    fi
    for cfg in "${tri_cfgs[@]}"; do
      d=${cfg%%/*} p=${cfg#*/} label="triton-$tag-d$d-p${p//,/_}"
      start_triton "$d" "$p" "$per_model" "$@"
      g=$(ladder "$label" "$proto" "$mix" "$slos" "$rates")
      stop_server
      log "  triton delay $d us, preferred $p: goodput $g req/s"
      if awk -v a="$g" -v b="$g_tri" 'BEGIN{exit !(a > b)}' || [ -z "$cfg_tri" ]; then g_tri=$g cfg_tri=$cfg; fi
    done
    [ -n "$best_triton_cfg" ] || best_triton_cfg=$cfg_tri
    if [ "$quick" != 1 ] && [ "$proto" = http ]; then
      start_triton "${cfg_tri%%/*}" "${cfg_tri#*/}" "$per_model" "$@"
      closed_loop "triton-$tag" "$1"; stop_server
    fi
    "$py" - "$out" "$tag" "$cfg_tri" "$g_ours" "$g_tri" "$cap" "$slos" >> "$results" <<'EOF'
import json, os, sys
out, tag, cfg, g_ours, g_tri, cap, slos = sys.argv[1:]
def rungs(label):
    return [json.loads(l) for l in open(os.path.join(out, label + ".jsonl")) if '"rate"' in l]
def at(rs, rate):
    r = next((x for x in rs if x["rate"] == float(rate)), None)
    return None if r is None else {k: r[k] for k in ("rate", "p50_ms", "p99_ms", "bad_rate", "server_cpu_ms_per_inference", "server_stages") if k in r}
d, p = cfg.split("/")
ours, tri = rungs("ours-" + tag), rungs(f"triton-{tag}-d{d}-p{p.replace(',', '_')}")
light = ours[0]["rate"] if ours else None
def pa(label):
    f = os.path.join(out, label + "-pa.csv")
    if not os.path.exists(f) or os.path.exists(os.path.join(out, label + "-pa.failed")):
        return "failed" if os.path.exists(os.path.join(out, label + "-pa.failed")) else None
    rows = [l.strip().split(",") for l in open(f) if l.strip()]
    h = rows[0]
    return [{"concurrency": int(r[h.index("Concurrency")]), "infer_per_s": float(r[h.index("Inferences/Second")]),
             "p50_ms": float(r[h.index("p50 latency")]) / 1e3, "p99_ms": float(r[h.index("p99 latency")]) / 1e3}
            for r in rows[1:] if r[0].isdigit()]
res = {
    "case": tag, "slo_ms": slos, "capacity_estimate_rps": float(cap),
    "symphony": {"goodput_rps": float(g_ours), "at_goodput": at(ours, g_ours), "light_load": at(ours, light), "closed_loop": pa("ours-" + tag)},
    "triton": {"goodput_rps": float(g_tri), "config": {"max_queue_delay_us": int(d), "preferred_batch_size": p},
               "at_goodput": at(tri, g_tri), "light_load": at(tri, light), "closed_loop": pa("triton-" + tag)},
}
res["goodput_ratio"] = round(float(g_ours) / float(g_tri), 3) if float(g_tri) > 0 else None
lo, lt = res["symphony"]["light_load"], res["triton"]["light_load"]
res["light_load_p99_ratio"] = round(lo["p99_ms"] / lt["p99_ms"], 3) if lo and lt and lt["p99_ms"] else None
print(json.dumps(res))
EOF
    log "  $(tail -n 1 "$results" | "$py" -c 'import json,sys; r=json.load(sys.stdin); print("goodput_ratio", r["goodput_ratio"], "light_load_p99_ratio", r["light_load_p99_ratio"])')"
  done
done

# ---------------------------------------------------------------- report
"$py" - "$results" "$quick" "$((SECONDS - t_start))" "$(nproc)" "$(lscpu | sed -n 's/^Model name: *//p')" "$(cut -d' ' -f1-3 /proc/loadavg)" > "$out/summary.md" <<'EOF'
import json, sys, time
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"# Symphony vs Triton 2.51 (equal instances, 1 ORT thread each); {'quick' if sys.argv[2] == '1' else 'full'} run, {sys.argv[3]} s")
print(f"machine: {sys.argv[4]} cores, {sys.argv[5]}, load avg at end {sys.argv[6]}; {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}")
print("goodput = highest Poisson rate with <= 1% late/failed/wrong (the model's own SLO); p50/p99/CPU at that rate; light = first rung (5% of the capacity estimate)\n")
print("| case | SLO ms | Symphony goodput | Triton goodput (delay us / preferred) | ratio | p50/p99 ms ours | p50/p99 ms Triton | CPU ms/inf ours | CPU ms/inf Triton | light p99 ours / Triton |")
print("|---|---|---|---|---|---|---|---|---|---|")
f = lambda x, k: "-" if not x else x.get(k)
for r in rows:
    s, t = r["symphony"], r["triton"]
    c = t["config"]
    print(f"| {r['case']} | {r['slo_ms']} | {s['goodput_rps']} | {t['goodput_rps']} ({c['max_queue_delay_us']} / {c['preferred_batch_size']}) | {r['goodput_ratio']} | "
          f"{f(s['at_goodput'],'p50_ms')}/{f(s['at_goodput'],'p99_ms')} | {f(t['at_goodput'],'p50_ms')}/{f(t['at_goodput'],'p99_ms')} | "
          f"{f(s['at_goodput'],'server_cpu_ms_per_inference')} | {f(t['at_goodput'],'server_cpu_ms_per_inference')} | "
          f"{f(s['light_load'],'p99_ms')} / {f(t['light_load'],'p99_ms')} ({r['light_load_p99_ratio']}) |")
for r in rows:
    g = r["symphony"]["at_goodput"] or {}
    sp = g.get("server_stages")
    if sp:
        st = ", ".join(f"{k} {v}" for k, v in sp["stages_us"].items())
        print(f"\nSymphony's server-side split at goodput, {r['case']} (mean us per executed request): {st}; "
              f"end to end {sp['end_to_end_us']}; mean batch {sp['mean_batch']}; late starts (> 100 us) {sp['late_starts']} of {sp['batches']} batches, "
              f"mean start lateness {sp.get('mean_start_lateness_us')} us; late answers {sp.get('late_answers')}; "
              f"dispatch lag {sp['dispatch_lag_us']} us")
for r in rows:
    for who in ("symphony", "triton"):
        cl = r[who]["closed_loop"]
        if cl:
            print(f"\nclosed loop (perf_analyzer HTTP) {r['case']} {who}: " + ("failed" if cl == "failed" else
                  "; ".join(f"c{x['concurrency']} {x['infer_per_s']:.0f}/s p50 {x['p50_ms']:.2f} p99 {x['p99_ms']:.2f}" for x in cl)))
EOF
if [ "$json" = 1 ]; then
  "$py" -c 'import json,sys; print(json.dumps({"cases": [json.loads(l) for l in open(sys.argv[1])], "seconds": int(sys.argv[2])}))' "$results" "$((SECONDS - t_start))"
else
  cat "$out/summary.md"
fi
