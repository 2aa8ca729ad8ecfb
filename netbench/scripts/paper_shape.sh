#!/usr/bin/env bash
# netbench/scripts/paper_shape.sh OUTDIR [ROUNDS] - the paper's incast (Symphony, Appendix B):
# 8 servers x 8 objects x 150 KiB, on tcp, tcp-blocking and shm with `netbench local`,
# interleaved ROUNDS times (default 3). Saves every run's JSON in OUTDIR, prints the median
# over rounds of each column, and draws OUTDIR/paper-shape.svg from the last round.
# Knobs: ITERS (default 3000), TRANSPORTS, NETBENCH (binary), EXTRA (more netbench args).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
B=${NETBENCH:-$REPO/target/netbench/release/netbench}
OUT=${1:?usage: paper_shape.sh OUTDIR [ROUNDS]}
ROUNDS=${2:-3}
ITERS=${ITERS:-3000}
TRANSPORTS=${TRANSPORTS:-"tcp tcp-blocking shm"}
EXTRA=${EXTRA:-}
mkdir -p "$OUT"
for r in $(seq 1 "$ROUNDS"); do
  for t in $TRANSPORTS; do
    # shellcheck disable=SC2086
    "$B" local -t "$t" --servers 8 --objects 8 --size 150KiB --iters "$ITERS" $EXTRA \
      --label "$t" --save "$OUT/paper-$t-r$r.json" >/dev/null
    echo "round $r $t done" >&2
  done
done
python3 - "$OUT" "$ROUNDS" $TRANSPORTS <<'PY'
import json, sys, statistics as st
out, rounds, ts = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
cols = ["t_min", "t_typical", "t_avg", "p99", "p99_9", "p99_99", "t_max"]
print("| transport | metric | " + " | ".join(cols) + " | p99.99 / median |")
print("|---|---|" + "---:|" * (len(cols) + 1))
for t in ts:
    reps = [json.load(open(f"{out}/paper-{t}-r{r}.json")) for r in range(1, rounds + 1)]
    for i, m in enumerate(reps[0]["metrics"]):
        med = {c: st.median(r["metrics"][i][c] for r in reps) for c in cols}
        ratio = st.median(r["metrics"][i]["p99_99"] / r["metrics"][i]["t_typical"] for r in reps)
        print(f"| {t} | {m['name']} | " + " | ".join(f"{med[c]:.1f}" for c in cols) + f" | {ratio:.1f} |")
PY
last=()
for t in $TRANSPORTS; do last+=("$OUT/paper-$t-r$ROUNDS.json"); done
"$B" plot "${last[@]}" --out "$OUT/paper-shape.svg" --title "8 servers x 8 objects x 150 KiB incast, this host (round $ROUNDS)"
