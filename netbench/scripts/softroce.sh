#!/usr/bin/env bash
# netbench/scripts/softroce.sh [single|pair|both|perftest] - netbench on real RDMA verbs (Soft-RoCE).
#
# `perftest`: netbench lat/bw next to perftest's ib_{read,write,send}_{lat,bw} in one guest
# (guest_perftest.sh: sizes 2 B, 4 KiB, 64 KiB, 1 MiB, 3 alternating rounds, medians compared;
# -d/-i/-x checked); knobs LAT_ITERS BW_ITERS ROUNDS SIZES VERBS GID_INDEX READ_DEPTH MAX_READS
# BUSY_POLL SEND_SLOTS ACK_TIMEOUT POST_LIST READ_PROBE (READ 2 B latency variants, see
# guest_perftest.sh).
# NETBENCH_BIN=path: use that binary instead of building one (e.g. the workspace build's
# target/release/netbench, which runs READ and SEND; WRITE needs --features rdma).
#
# Builds netbench with --features rdma on the host, stages it with the guest scripts
# (guest_single.sh, guest_pair.sh, and tests/softroce/guest/perftest.sh, used read-only), and runs
# them with tests/softroce/run.sh (which copies the binary's libraries into the guest). Files the
# guests print between "=== BEGIN name" / "=== END name" are written to OUT (default
# docs/calibrations/runs; .toml files go to docs/calibrations). Guest logs: OUT/softroce-*.log.
# Knobs: passed to the guests: LAT_ITERS ROUNDS SIZES PAPER_ITERS CAL_ITERS SKIP_PAPER SKIP_CAL
# PAIR_STEPS PAIR_CONC, and the rdma transport's SYMPHONY_RDMA_READ_DEPTH SYMPHONY_RDMA_ACK_TIMEOUT;
# to run.sh: TIMEOUT (default 1500 s per VM), ACCEL, SOFTROCE_WORK.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
MODE=${1:-both}
OUT=${OUT:-$REPO/docs/calibrations/runs}
CAL=$REPO/docs/calibrations
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target/netbench}
export TIMEOUT=${TIMEOUT:-1500}
if [ -z "${NETBENCH_BIN:-}" ]; then
  (cd "$REPO" && cargo build -p netbench --release --features rdma)
  NETBENCH_BIN=$CARGO_TARGET_DIR/release/netbench
fi
STAGE=$(mktemp -d "${TMPDIR:-/tmp}/netbench-softroce.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
cp "$NETBENCH_BIN" "$STAGE/netbench"
cp "$REPO/tests/softroce/guest/perftest.sh" "$REPO"/netbench/scripts/guest_*.sh "$STAGE/"
mkdir -p "$OUT"
envs=""
for v in READ_PROBE LAT_ITERS BW_ITERS VERBS GID_INDEX READ_DEPTH MAX_READS BUSY_POLL SEND_SLOTS ACK_TIMEOUT POST_LIST ROUNDS SIZES PAPER_ITERS CAL_ITERS SKIP_PAPER SKIP_CAL PAIR_STEPS PAIR_CONC \
         SYMPHONY_RDMA_READ_DEPTH SYMPHONY_RDMA_ACK_TIMEOUT; do
  [ -n "${!v:-}" ] && envs="$envs $v='${!v}'"
done
extract() { # $1 = log: write every BEGIN/END block to its file
  python3 - "$1" "$OUT" "$CAL" <<'PY'
import sys, os
log, out, cal = sys.argv[1:4]
name, buf = None, []
for line in open(log, errors="replace"):
    line = line.rstrip("\n")
    if line.startswith("=== BEGIN "):
        name, buf = line[10:].strip(), []
    elif line.startswith("=== END ") and name:
        path = os.path.join(cal if name.endswith(".toml") else out, name)
        open(path, "w").write("\n".join(buf) + "\n")
        print("wrote", path)
        name = None
    elif name:
        buf.append(line)
PY
}
summary() { # latency table: netbench read row vs perftest's row, medians over rounds
  python3 - "$1" <<'PY'
import sys, statistics as st
nb, pt = {}, {}
for line in open(sys.argv[1], errors="replace"):
    f = line.split()
    if f[:1] == ["NB"] and len(f) >= 3:
        c = f[2].split(",")   # transport,metric,bytes,iters,min,max,typical,avg,stdev,p99,p99.9,p99.99
        nb.setdefault(int(f[1]), []).append([float(c[6]), float(c[9]), float(c[10])])
    elif f[:1] == ["PERFTEST"] and len(f) >= 10:
        try: pt.setdefault(int(f[1]), []).append([float(f[5]), float(f[8]), float(f[9])])
        except ValueError: pass
med = lambda rows, i: st.median(r[i] for r in rows)
print("| size (B) | runs | netbench read p50 | p99 | p99.9 | ib_read_lat typical | p99 | p99.9 | p50 / typical |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for s in sorted(nb):
    o, p = nb[s], pt.get(s)
    row = f"| {s} | {len(o)} | {med(o,0):.1f} | {med(o,1):.1f} | {med(o,2):.1f} |"
    row += f" {med(p,0):.1f} | {med(p,1):.1f} | {med(p,2):.1f} | {med(o,0)/med(p,0):.2f} |" if p else " n/a | n/a | n/a | n/a |"
    print(row)
PY
}
perftest_summary() { # medians over rounds: netbench against perftest, per test, verb and size
  python3 - "$1" <<'PY'
import sys, statistics as st
nb, pt = {}, {}
for line in open(sys.argv[1], errors="replace"):
    f = line.split()
    if f[:1] == ["NB"] and len(f) >= 5:
        c = f[4].split(",")
        try:
            # lat csv: transport,verb,load,bytes,iters,min,max,typical,...; bw: transport,verb,bytes,iters,peak,avg,rate
            v = float(c[7]) if f[1] == "lat" else float(c[5])
        except (IndexError, ValueError):
            continue
        nb.setdefault((f[1], f[2], int(f[3])), []).append(v)
    elif f[:1] == ["PT"] and len(f) >= 9:
        try:   # lat row: bytes iters min max typical ...; bw row: bytes iters peak avg rate
            v = float(f[8]) if f[1] == "lat" else float(f[7])
        except ValueError:
            continue
        pt.setdefault((f[1], f[2], int(f[3])), []).append(v)
print("| test | verb | size (B) | runs | netbench | perftest | netbench / perftest | bar |")
print("|---|---|---:|---:|---:|---:|---:|---|")
for k in sorted(nb):
    o, p = nb[k], pt.get(k)
    unit = "us (t_typical)" if k[0] == "lat" else "MB/s (average)"
    if not p:
        print(f"| {k[0]} | {k[1]} | {k[2]} | {len(o)} | {st.median(o):.2f} | n/a | n/a | |"); continue
    r = st.median(o) / st.median(p)
    ok = r <= 1.15 if k[0] == "lat" else r >= 0.9
    bar = ("<= 1.15" if k[0] == "lat" else ">= 0.90") + (" met" if ok else " NOT met")
    print(f"| {k[0]} | {k[1]} | {k[2]} | {len(o)} | {st.median(o):.2f} | {st.median(p):.2f} | {r:.2f} | {bar} |")
print("(lat: microseconds, t_typical = median; bw: MB/s = 2^20 B/s, BW average; medians over rounds)")
PY
}
rc=0
if [ "$MODE" = perftest ]; then
  "$REPO/tests/softroce/run.sh" --mode single --dir "$STAGE" "$envs sh ./guest_perftest.sh" 2>&1 | tee "$OUT/softroce-perftest.log" || rc=1
  perftest_summary "$OUT/softroce-perftest.log"
  grep '^SELECT' "$OUT/softroce-perftest.log" || true
fi
if [ "$MODE" = single ] || [ "$MODE" = both ]; then
  "$REPO/tests/softroce/run.sh" --mode single --dir "$STAGE" "$envs sh ./guest_single.sh" 2>&1 | tee "$OUT/softroce-single.log" || rc=1
  extract "$OUT/softroce-single.log"
  summary "$OUT/softroce-single.log"
fi
if [ "$MODE" = pair ] || [ "$MODE" = both ]; then
  "$REPO/tests/softroce/run.sh" --mode pair --dir "$STAGE" "$envs sh ./guest_pair.sh" 2>&1 | tee "$OUT/softroce-pair.log" || rc=1
  extract "$OUT/softroce-pair.log"
fi
exit $rc
