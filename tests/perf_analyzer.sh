#!/usr/bin/env bash
# Triton's perf_analyzer (tritonclient 2.41.1's binary, installed by
# ../shared/tools/triton-reference.sh setup into $TRITON_REF_DIR) unchanged against
# `symphony up --serve`, over HTTP and over gRPC: concurrency 4 for ~10 s each (3 windows of
# 3.3 s), then checks 0 failed requests (perf_analyzer aborts on any; the server's /stats
# fail count must not move) and that perf_analyzer's infer/s is within 5% of the server's
# own count: the /stats success delta over perf_analyzer's run time. ~1 minute once built.
# Env: TRITON_REF (default ../shared/tools/triton-reference.sh), TRITON_REF_DIR,
#      SYMPHONY_PROFILE (release|debug, default release), PA_TOLERANCE_PCT (default 5).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
tref="${TRITON_REF:-$root/../shared/tools/triton-reference.sh}"
tdir="${TRITON_REF_DIR:-$HOME/.cache/triton-reference}"
profile="${SYMPHONY_PROFILE:-release}"
tol="${PA_TOLERANCE_PCT:-5}"
PY="${PYTHON:-python3}"
log() { echo "[perf_analyzer] $*" >&2; }
. "$root/tests/lib/require.sh"
# The Triton reference is a script beside the repository (installable anywhere): under CI its
# absence is a failure, not a skip (tests/lib/require.sh).
require tests/perf_analyzer.sh triton-reference \
  "the Triton reference script $tref (TRITON_REF), which installs perf_analyzer" test -f "$tref" || exit 0
bash "$tref" setup
flag=(); [ "$profile" = release ] && flag=(--release)
build="cargo build ${flag[*]} -p tools --bin symphony"
# RELEASE_BUILD (tests/run.sh): its test step's build command, a no-op here.
[ "$profile" = release ] && build=${RELEASE_BUILD:-$build}
# shellcheck disable=SC2086
(cd "$root" && timeout 900 $build -q)
bin="$CARGO_TARGET_DIR/$profile/symphony"
site=$("$tdir/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

tmp="$(mktemp -d)"
. "$root/tests/lib/up_serve.sh"
# One model with a 200 ms SLO: closed-loop concurrency 4 never comes near it, so no request is
# shed (perf_analyzer aborts a measurement on any failed request).
up_serve "$tmp" --serve --models none --model tc_model=0.268,5.172,200
log "daemons up: http $url grpc $grpc_url"

# successes failures of tc_model from /stats
stats() {
  "$PY" - "$url" <<'PYEOF'
import json, sys, urllib.request
s = json.load(urllib.request.urlopen(f"http://{sys.argv[1]}/v2/models/tc_model/stats", timeout=5))
i = s["model_stats"][0]["inference_stats"]
print(i["success"]["count"], i["fail"]["count"])
PYEOF
}

run() {  # run PROTOCOL HOST:PORT [NAME EXTRA-FLAGS...]
  local proto=$1 hp=$2 name=${3:-$1} csv="$tmp/${3:-$1}.csv" s0 f0 s1 f1 t0 t1
  shift 2; [ $# -gt 0 ] && shift
  local extra=("$@")
  read -r s0 f0 < <(stats)
  t0=$(date +%s.%N)
  if ! LD_LIBRARY_PATH="$site/nvidia/cuda_runtime/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    timeout 120 "$tdir/venv/bin/perf_analyzer" -m tc_model -u "$hp" -i "$proto" -b 1 "${extra[@]}" \
    --concurrency-range 4 --measurement-interval 3300 --stability-percentage 100 --max-trials 3 \
    -f "$csv" > "$tmp/$name.log" 2>&1; then
    cat "$tmp/$name.log"; log "FAIL: perf_analyzer over $name"; exit 1
  fi
  t1=$(date +%s.%N)
  read -r s1 f1 < <(stats)
  local pa
  pa=$(awk -F, 'NR==1{for(i=1;i<=NF;i++)c[$i]=i;next} NR==2{print $c["Inferences/Second"]}' "$csv")
  awk -v pa="$pa" -v n=$((s1 - s0)) -v f=$((f1 - f0)) -v t0="$t0" -v t1="$t1" -v tol="$tol" -v p="$name" 'BEGIN {
    srv = n / (t1 - t0); dev = (pa - srv) / srv * 100; if (dev < 0) dev = -dev
    printf "[perf_analyzer] %s: perf_analyzer %.1f infer/s, /stats %d successes in %.2f s = %.1f/s (%.1f%% apart), %d failed\n", p, pa, n, t1 - t0, srv, dev, f
    exit !(f == 0 && n > 0 && dev <= tol)
  }' || { cat "$tmp/$name.log"; log "FAIL over $name"; exit 1; }
  grep -E "Server:|queue|Compute" "$tmp/$name.log" | head -8 >&2 || true
  # The server-side figures perf_analyzer computes from our statistics extension must be real:
  # "Avg request latency: N usec (overhead a usec + queue q usec + compute input i usec +
  # compute infer c usec + compute output o usec)" with q > 0 and c > 0.
  awk -v p="$name" '/Avg request latency:/ && /queue/ {
      for (i = 1; i <= NF; i++) { if ($i == "queue") q = $(i + 1); if ($i == "infer") c = $(i + 1) }
      found = 1 }
    END { if (!found || q + 0 <= 0 || c + 0 <= 0) { printf "[perf_analyzer] %s: server-side queue %s usec, compute infer %s usec: want both > 0\n", p, q, c; exit 1 } }' \
    "$tmp/$name.log" || { cat "$tmp/$name.log"; log "FAIL: server-side figures over $name"; exit 1; }
}
run http "$url"
run grpc "$grpc_url"
run grpc "$grpc_url" grpc-streaming --streaming
up_stop
log "ok: perf_analyzer over HTTP, gRPC and gRPC streaming, 0 errors, throughput within ${tol}% of /stats"
