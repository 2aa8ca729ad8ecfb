#!/bin/bash
# Side-by-side capacity runs of two builds of `symphony` on one machine: the
# builds alternate within each round, so both see the same background load.
# Usage: scripts/ab-bench.sh BIN_A BIN_B OUT_DIR [ROUNDS]
# Writes OUT_DIR/{shm,tcp,bs}_{a,b}_ROUND.json and the load before each run.
set -euo pipefail
a=${1:?BIN_A}; b=${2:?BIN_B}; out=${3:?OUT_DIR}; rounds=${4:-3}
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  for side in a b; do
    bin=$a; [ "$side" = b ] && bin=$b
    uptime > "$out/load_${side}_$r.txt"
    for t in shm tcp; do
      "$bin" bench-cluster --transport "$t" --gpus 1000 --rate 1000000 --duration-s 5 --json \
        > "$out/${t}_${side}_$r.json" 2> "$out/${t}_${side}_$r.err" || true
    done
    "$bin" bench-scheduler --profile-copies 20 --gpus 1000 --rate 1000000 --idle park --duration-s 3 --json \
      > "$out/bs_${side}_$r.json" 2> "$out/bs_${side}_$r.err" || true
  done
done
