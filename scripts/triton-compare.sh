#!/usr/bin/env bash
# Side by side with NVIDIA Triton on the PP-OCR classifier (ppocr_cls), same CPU, one command:
#   bash scripts/triton-compare.sh [OUT_DIR]          (default target/triton-compare)
# 1. models (scripts/fetch-models.sh), `symphony` (release), its profile (symphony profile);
# 2. real Triton via ../shared/tools/triton-reference.sh (its setup installs tritonserver and
#    perf_analyzer); SLO = 2 x Triton's p50 at concurrency 1 (default config: 1 instance, 100 us);
# 3. open-loop goodput with perf_analyzer --request-rate-range R:R --request-distribution poisson:
#    the highest rate of RATES whose p99 <= SLO (i.e. <= 1% of requests over the SLO), for Triton
#    at max_queue_delay_microseconds in {0,100,500,2000} x instance count {1,2} (best reported),
#    and for `symphony up --model-repository` (1 frontend, 1 backend running ONNX Runtime) with
#    the SLO its scheduler plans for at 1, 2 and 4 x the comparison SLO (best reported); then perf_analyzer's concurrency sweep 1,4,8,16 for both
#    (Triton at its best-goodput configuration). Results: OUT_DIR/summary.md (+ CSVs, logs).
# Env: RATES (default "10 25 50 100 200 400 600 800"), PA_WINDOW_MS (default 3000),
#      TRITON_REF (default ../shared/tools/triton-reference.sh).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/target/triton-compare}"
tref="${TRITON_REF:-$root/../shared/tools/triton-reference.sh}"
rates="${RATES:-10 25 50 100 200 400 600 800}"
export PA_WINDOW_MS="${PA_WINDOW_MS:-3000}" PA_STABILITY="${PA_STABILITY:-50}" PA_TRIALS="${PA_TRIALS:-6}"
tdir="${TRITON_REF_DIR:-$HOME/.cache/triton-reference}"
mkdir -p "$out"
log() { echo "[triton-compare] $*" >&2; }
[ -f "$tref" ] || { log "no $tref"; exit 1; }

bash "$root/scripts/setup.sh"
bash "$root/scripts/fetch-models.sh"
(cd "$root" && cargo build -q --release -p tools --bin symphony)
sym="${CARGO_TARGET_DIR:-$root/target}/release/symphony"
bash "$tref" setup

# p50/p99 (ms) and throughput of the first row of a perf_analyzer CSV.
row() { awk -F, 'NR==1{for(i=1;i<=NF;i++)c[$i]=i;next} NR==2{printf "%.1f %.3f %.3f\n",$c["Inferences/Second"],$c["p50 latency"]/1000,$c["p99 latency"]/1000}' "$1"; }

# perf_analyzer in open-loop (request-rate) mode; the reference script's `perf` wrapper always
# sets --concurrency-range, which excludes --request-rate-range, so it is called directly here
# with the same settings (the venv and libcudart of the reference setup).
pa_rate() {  # pa_rate HOSTPORT RATE CSV
  local venv="$tdir/venv" site
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  LD_LIBRARY_PATH="$site/nvidia/cuda_runtime/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$venv/bin/perf_analyzer" -m ppocr_cls -u "$1" -i http -b 1 --shape x:3,48,192 \
    --request-rate-range "$2:$2:1" --request-distribution poisson \
    --measurement-interval "$PA_WINDOW_MS" --stability-percentage "$PA_STABILITY" --max-trials "$PA_TRIALS" -f "$3"
}

# goodput LABEL HOSTPORT: the highest rate of the ladder with p99 <= SLO; appends rows to
# $out/LABEL.rates. The ladder goes on past a rate that misses and stops after two misses in a
# row: at the lowest rates a window holds few requests, so one late request (a parked thread's
# wake-up on this shared machine) fails it without saying anything about the rates above.
goodput() {
  local label=$1 hp=$2 best=0 misses=0 r csv
  : > "$out/$label.rates"
  for r in $rates; do
    csv="$out/$label-r$r.csv"
    if pa_rate "$hp" "$r" "$csv" > "$out/$label-r$r.log" 2>&1 && [ -s "$csv" ]; then
      read -r tput p50 p99 < <(row "$csv")
      echo "$r $tput $p50 $p99" >> "$out/$label.rates"
      if awk -v a="$p99" -v b="$slo" 'BEGIN{exit !(a <= b)}'; then best=$r misses=0; else misses=$((misses + 1)); fi
    else
      echo "$r fail - -" >> "$out/$label.rates"; misses=$((misses + 1))
    fi
    [ "$misses" -lt 2 ] || break
  done
  echo "$best"
}

triton_config() {  # triton_config DELAY_US INSTANCES
  local cfg="$tdir/models/ppocr_cls/config.pbtxt"
  sed -i -E "s/max_queue_delay_microseconds: [0-9]+/max_queue_delay_microseconds: $1/; s/count: [0-9]+/count: $2/" "$cfg"
}

# --- Triton at concurrency 1: the SLO ---
triton_config 100 1
bash "$tref" server --http-port 8000 --grpc-port 8001 --metrics-port 8002
trap 'bash "$tref" stop || true' EXIT
bash "$tref" perf 127.0.0.1:8000 --concurrency 1 --csv "$out/triton-c1.csv" > "$out/triton-c1.log" 2>&1
read -r _ t_p50 _ < <(row "$out/triton-c1.csv")
slo=$(awk -v p="$t_p50" 'BEGIN{printf "%.3f", 2*p}')
log "Triton p50 at concurrency 1: $t_p50 ms -> SLO $slo ms"
bash "$tref" stop

# --- Triton goodput over the tuning grid ---
best_t=0 best_cfg=""
for inst in 1 2; do
  for delay in 0 100 500 2000; do
    triton_config "$delay" "$inst"
    bash "$tref" server --http-port 8000 --grpc-port 8001 --metrics-port 8002
    g=$(goodput "triton-d$delay-i$inst" 127.0.0.1:8000)
    bash "$tref" stop
    log "Triton delay $delay us, $inst instance(s): goodput $g rps"
    echo "triton delay=$delay instances=$inst goodput=$g" >> "$out/grid.txt"
    if [ "$g" -gt "$best_t" ]; then best_t=$g; best_cfg="$delay $inst"; fi
  done
done
[ -n "$best_cfg" ] || best_cfg="100 1"

# --- ours: the repository with the comparison SLO (x 1, 2, 4: the SLO our scheduler plans for is
# our tuning knob, as the queue delay is Triton's; perf_analyzer aborts a run on any error, and
# the deferred scheduler answers a request it cannot finish in time with a 503 at once) ---
"$sym" profile --model-repository "$root/models" --models ppocr_cls --runs 30 --out "$out/profile.json" > "$out/profile.txt"
start_ours() {  # start_ours SLO_MS: sets $ours (HOST:PORT) and $up_pid
  local repo="$out/repo-$1"
  rm -rf "$repo"; mkdir -p "$repo/ppocr_cls/1"
  ln -sf "$root/models/ppocr_cls/1/model.onnx" "$repo/ppocr_cls/1/model.onnx"
  sed -E "s/string_value: \"[0-9.]+\"/string_value: \"$1\"/" "$root/models/ppocr_cls/config.pbtxt" > "$repo/ppocr_cls/config.pbtxt"
  cp "$out/profile.json" "$repo/profile.json"
  : > "$out/up-$1.out"
  "$sym" up --model-repository "$repo" --frontends 1 --backends 1 > "$out/up-$1.out" 2> "$out/up-$1.err" &
  up_pid=$!
  for _ in $(seq 120); do grep -q "^frontend 1: http://" "$out/up-$1.out" 2>/dev/null && break; sleep 0.5; done
  ours=$(grep -o "127.0.0.1:[0-9]*" "$out/up-$1.out" | head -1)
  [ -n "$ours" ] || { log "symphony up did not start (see $out/up-$1.err)"; exit 1; }
}
up_pid=""
stop_ours() { [ -n "$up_pid" ] || return 0; kill -INT "$up_pid" 2>/dev/null || true; wait "$up_pid" || true; }
trap 'stop_ours; bash "$tref" stop || true' EXIT
g_ours=0 best_mult=4
for mult in 1 2 4; do
  slo_ours=$(awk -v s="$slo" -v m="$mult" 'BEGIN{printf "%.3f", s*m}')
  start_ours "$slo_ours"
  g=$(goodput "ours-slo$mult" "$ours")
  stop_ours
  log "Symphony, scheduler SLO $slo_ours ms ($mult x): goodput $g rps"
  echo "symphony scheduler_slo=${slo_ours}ms goodput=$g" >> "$out/grid.txt"
  if [ "$g" -gt "$g_ours" ]; then g_ours=$g; best_mult=$mult; fi
done
slo_ours=$(awk -v s="$slo" -v m="$best_mult" 'BEGIN{printf "%.3f", s*m}')
start_ours "$slo_ours"
bash "$tref" perf "$ours" --concurrency 1:4:3 --csv "$out/ours-conc.csv" > "$out/ours-conc.log" 2>&1 || true
bash "$tref" perf "$ours" --concurrency 8:16:8 --csv "$out/ours-c16.csv" > "$out/ours-c16.log" 2>&1 || true
stop_ours

# --- Triton's concurrency sweep at its best configuration ---
# shellcheck disable=SC2086
triton_config $best_cfg
bash "$tref" server --http-port 8000 --grpc-port 8001 --metrics-port 8002
bash "$tref" perf 127.0.0.1:8000 --concurrency 1:4:3 --csv "$out/triton-conc.csv" > "$out/triton-conc.log" 2>&1 || true
bash "$tref" perf 127.0.0.1:8000 --concurrency 8:16:8 --csv "$out/triton-c16.csv" > "$out/triton-c16.log" 2>&1 || true
bash "$tref" stop
trap - EXIT

conc() {  # conc CSV...: "c: tput p50 p99" lines
  cat "$@" 2>/dev/null | awk -F, '/^Concurrency/{for(i=1;i<=NF;i++)c[$i]=i;next} NF>3{printf "| %s | %.0f | %.2f | %.2f |\n",$c["Concurrency"],$c["Inferences/Second"],$c["p50 latency"]/1000,$c["p99 latency"]/1000}' | sort -t'|' -k2,2n -u
}
{
  echo "machine: $(nproc) cores, $(awk '/MemTotal/{printf "%.0f GiB", $2/1048576}' /proc/meminfo), load avg $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "SLO = 2 x Triton p50 at concurrency 1 ($t_p50 ms) = $slo ms; goodput = highest Poisson rate (of: $rates) with p99 <= SLO"
  echo
  echo "| server | configuration | goodput (req/s) |"
  echo "|---|---|---|"
  grep '^triton' "$out/grid.txt" | while read -r _ d i g; do echo "| Triton 2.51 | ${d/=/ } us, ${i/=/ } | ${g#goodput=} |"; done
  grep '^symphony' "$out/grid.txt" | while read -r _ s g; do echo "| Symphony (1 frontend, 1 backend, ONNX Runtime 1 thread) | ${s/=/ } | ${g#goodput=} |"; done
  echo
  echo "best Triton: $best_t req/s (delay/instances $best_cfg); Symphony: $g_ours req/s (scheduler SLO $slo_ours ms); ratio $(awk -v a="$g_ours" -v b="$best_t" 'BEGIN{if(b>0)printf "%.2f",a/b; else print "n/a"}')"
  echo
  echo "per-rate results (rate: throughput, p50 ms, p99 ms):"
  for f in "$out"/*.rates; do echo "- $(basename "$f" .rates): $(awk '{printf "%s: %s/s %s %s; ", $1,$2,$3,$4}' "$f")"; done
  echo
  echo "Concurrency sweep (perf_analyzer, HTTP, closed loop), Triton at its best configuration:"
  echo "| concurrency | infer/s | p50 ms | p99 ms |"; echo "|---|---|---|---|"; conc "$out/triton-conc.csv" "$out/triton-c16.csv"
  echo
  echo "Symphony (scheduler SLO $slo_ours ms):"
  echo "| concurrency | infer/s | p50 ms | p99 ms |"; echo "|---|---|---|---|"; conc "$out/ours-conc.csv" "$out/ours-c16.csv"
} > "$out/summary.md"
cat "$out/summary.md"
